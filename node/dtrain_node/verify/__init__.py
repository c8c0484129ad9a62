"""Judging other members' work, apart from doing one's own: what a member, a checker and a
referee check, from evidence anyone can re-check.

The operator (node, epoch, challenger) and the referee service use it through these entry
points, and hand in everything it needs (the job's files already fetched, the hosts' fetches):
nothing here imports the operator.

- `evidence`: an epoch's canonical transcript as one file (`decode`, `load`, `verify`).
- `recompute`: an attempt re-executed from its transcript (`Attempt`, `recompute`).
- `spotcheck`, `replaycheck`, `epochchecks`: replay spot checks during an epoch (who checks
  whom, the private states kept and served, `EpochChecks` as the trainer runs them).
- `claims`: a failed check as signed, self-contained evidence.
- `fraudcheck`: a referee's re-run of a claim (`applies`, `caught`).
"""
