"""The wiring between the SFT/DPO/GRPO/CPT backends and their pure losses: sampling positions,
chosen/rejected order, advantage sign, per-node seeds and small shards.

The pure losses are checked by hand in test_methods.py; these tests drive the backends
themselves, so a wrong position, a swapped pair or a flipped sign in finetune.py fails here.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from harness.jobs import tiny_job

from dtrain_node.errors import DatasetError
from dtrain_node.train import finetune, losses, shard, tasks
from dtrain_node.train.backend import make_backend

VOCAB = 259  # 256 bytes + BOS/EOS/PAD (models.tokenizer)


def tok(c: str) -> int:
    return finetune.encode(c)[0]


class Bigram(torch.nn.Module):
    """A policy whose next-token logits at position t depend only on token t (a lookup table),
    so the distribution at every position is known exactly."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return SimpleNamespace(logits=self.table[input_ids])


def row(alphabet: str, probs: dict[str, float]) -> torch.Tensor:
    """Logits over the vocabulary: `probs` on the listed letters, the rest of the mass spread
    evenly over the other alphabet letters, nothing outside the alphabet."""
    rest = [c for c in alphabet if c not in probs]
    spread = (1 - sum(probs.values())) / len(rest) if rest else 0.0
    out = torch.full((VOCAB,), float("-inf"))
    for c in alphabet:
        out[tok(c)] = math.log(probs.get(c, spread))
    return out


def grpo_backend(tmp_path, problems, **opts):
    path = tmp_path / "grpo.jsonl"
    h = tasks.make_dataset(path, "grpo", problems)
    return make_backend(tiny_job("grpo", path, h), options=finetune.MethodOptions(**opts))


def prompt_batch(prompt: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return finetune.left_pad([[finetune.BOS, *finetune.encode(prompt)]] * n, finetune.PAD)


# ---------------------------------------------------------------- GRPO: sampling position

P_ANSWER = 0.62  # the policy's probability of the answer right after the prompt


def last_letter_policy(b, answer: str) -> Bigram:
    """After ':' (the prompt's last token) P_ANSWER on `answer`; after a letter x, 0.9 on x.
    Sampling from the second to last position (the last letter) would see the 0.9 row."""
    table = torch.stack([row(b.alphabet, {}) for _ in range(VOCAB)])
    table[tok(":")] = row(b.alphabet, {answer: P_ANSWER})
    for c in b.alphabet:
        table[tok(c)] = row(b.alphabet, {c: 0.9})
    return Bigram(table)


def test_grpo_sampler_hit_rate_is_the_policy_probability(tmp_path):
    b = grpo_backend(tmp_path, tasks.last_letter(300, length=4, seed=0))
    assert b.width == 1 and b.alphabet == "abcdef"
    rec = next(r for r in b.eval_recs if r["answer"] == "c")
    b.model = last_letter_policy(b, "c")
    n = 4000
    ids, mask = prompt_batch(rec["prompt"], n)
    hits = (b.sample(ids, mask, seed=0)[:, 0] == b.alphabet.index("c")).float().mean().item()
    # Binomial: 4.5 standard deviations (0.035 here); the wrong position samples the 0.9 row.
    assert abs(hits - P_ANSWER) < 4.5 * math.sqrt(P_ANSWER * (1 - P_ANSWER) / n), hits
    # The rollout's pi_old (teacher forced) scores the same position.
    lp = b._completion_logps(b.model, ids[:1], mask[:1], torch.tensor([[b.alphabet.index("c")]]))
    assert lp.exp().item() == pytest.approx(P_ANSWER, rel=1e-5)


def test_grpo_greedy_accuracy_and_mean_reward_read_the_next_token(tmp_path):
    b = grpo_backend(tmp_path, tasks.last_letter(300, length=4, seed=0))
    b.model = last_letter_policy(b, "c")
    got = b.evaluate()
    answers = [r["answer"] for r in b.eval_recs]
    # Greedy after ':' is always "c"; the expected reward is P_ANSWER where the answer is "c".
    share_c = sum(a == "c" for a in answers) / len(answers)
    assert 0 < share_c < 0.5  # the metric can tell the right position from the wrong one
    assert got["accuracy"] == pytest.approx(share_c)
    spread = (1 - P_ANSWER) / 5
    expected = sum(P_ANSWER if a == "c" else spread for a in answers) / len(answers)
    assert got["mean_reward"] == pytest.approx(expected, rel=1e-5)


def test_grpo_multi_token_samples_follow_the_autoregressive_policy(tmp_path):
    # Two-letter answers; a random bigram table: P(c1 c2) = T[':'][c1] * T[c1][c2].
    b = grpo_backend(tmp_path, tasks.reversal(36, length=2, seed=0))
    assert b.width == 2 and b.alphabet == "abcdef"
    g = torch.Generator().manual_seed(5)
    table = torch.full((VOCAB, VOCAB), float("-inf"))
    for t in [":", *b.alphabet]:
        table[tok(t), b.alphabet_ids] = 2 * torch.randn(6, generator=g)
    b.model = Bigram(table)
    probs = torch.softmax(table[:, b.alphabet_ids], -1)
    first = probs[tok(":")]
    joint = first[:, None] * probs[b.alphabet_ids]  # [c1, c2]
    n = 6000
    ids, mask = prompt_batch("rev ab:", n)
    s = b.sample(ids, mask, seed=1)
    freq = torch.zeros(6, 6)
    freq.index_put_((s[:, 0], s[:, 1]), torch.ones(n), accumulate=True)
    freq /= n
    sd = (joint * (1 - joint) / n).sqrt()
    assert ((freq - joint).abs() <= 4.5 * sd + 1e-3).all(), (freq, joint)
    pairs = torch.tensor(list(itertools.product(range(6), repeat=2)))
    lp = b._completion_logps(b.model, ids[:36], mask[:36], pairs)
    assert torch.allclose(lp.sum(-1).exp(), joint.reshape(-1), rtol=1e-5)


# ---------------------------------------------------------------- DPO: chosen vs rejected


def dpo_backend(tmp_path):
    path = tmp_path / "dpo.jsonl"
    h = tasks.make_dataset(path, "dpo", tasks.last_letter(200, length=4, seed=0))
    return make_backend(tiny_job("dpo", path, h))


def margins(b, recs) -> torch.Tensor:
    """beta * ((pi - ref)(chosen) - (pi - ref)(rejected)) per record, computed here without the
    backend's collate or loss call."""

    def logps(model, field):
        ids, labels, mask = finetune.collate_labelled(
            finetune.byte_coder(), [(r["prompt"], r[field]) for r in recs]
        )
        with torch.no_grad():
            return losses.sequence_logps(model(input_ids=ids, attention_mask=mask).logits, labels)

    chosen = logps(b.model, "chosen") - logps(b.ref, "chosen")
    rejected = logps(b.model, "rejected") - logps(b.ref, "rejected")
    return b.opts.dpo_beta * (chosen - rejected)


def test_dpo_backend_steps_raise_chosen_over_rejected(tmp_path):
    torch.manual_seed(0)
    b = dpo_backend(tmp_path)
    recs = b.train[:16]
    assert margins(b, recs).abs().max().item() == 0.0  # pi == ref at the start
    batch = b.collate(recs, 0)
    opt = torch.optim.SGD(b.model.parameters(), lr=0.5)
    for _ in range(3):
        b.loss(batch).backward()
        opt.step()
        opt.zero_grad()
    m = margins(b, recs)
    assert m.mean().item() > 0 and (m > 0).float().mean().item() >= 0.75, m


def test_dpo_backend_loss_and_metrics_match_an_independent_computation(tmp_path):
    torch.manual_seed(0)
    b = dpo_backend(tmp_path)
    with torch.no_grad():
        for p in b.model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # policy != reference, so the order matters
    recs = b.eval_recs
    m = margins(b, recs)
    assert m.abs().min().item() > 0
    with torch.no_grad():
        got = b.loss(b.collate(recs, 0)).item()
    assert got == pytest.approx(-torch.nn.functional.logsigmoid(m).mean().item(), rel=1e-4)
    assert got != pytest.approx(-torch.nn.functional.logsigmoid(-m).mean().item(), rel=1e-4)
    ev = b.evaluate()
    assert ev["preference_accuracy"] == pytest.approx((m > 0).float().mean().item())
    assert ev["reward_margin"] == pytest.approx(m.mean().item(), rel=1e-4)


# ---------------------------------------------------------------- GRPO: advantage sign


def test_grpo_backend_step_raises_the_rewarded_completions(tmp_path):
    torch.manual_seed(0)
    b = grpo_backend(tmp_path, tasks.last_letter(100, length=4, seed=0))
    batch = next(b.batches(torch.arange(b.n_items()), 8, seed=0))
    ids, mask, comp, old, _, adv = b.rollout(batch)
    # Rewards and advantages recomputed here from the samples and the batch's answers.
    g = b.opts.grpo_group
    texts = ["".join(b.alphabet[i] for i in r) for r in comp.tolist()]
    rewards = torch.tensor([float(t == batch[2][i // g]) for i, t in enumerate(texts)])
    expect = losses.group_advantages(rewards.reshape(-1, g)).reshape(-1)
    assert (expect != 0).any()  # some group has both right and wrong samples
    assert torch.allclose(adv, expect)
    opt = torch.optim.SGD(b.model.parameters(), lr=0.1)
    b.loss(batch).backward()
    opt.step()
    with torch.no_grad():
        new = b._completion_logps(b.model, ids, mask, comp).sum(-1)
    # The step moves probability towards samples with positive advantage, away from the others.
    assert (expect * (new - old.sum(-1))).sum().item() > 0


# ---------------------------------------------------------------- seeds per node


def stream(idx: torch.Tensor, seed: int, n: int = 4) -> list[tuple[list[int], int]]:
    return [(i.tolist(), s) for i, s in itertools.islice(shard.batch_indices(idx, 4, seed), n)]


def test_nodes_given_the_same_seed_get_their_own_sampling_seeds():
    members = ["0xa1", "0xb2", "0xc3"]
    idx = {m: shard.assign(90, 7, 0, members, m) for m in members}
    seed = 7 * 1000 + 0  # what every node passes for job 7, attempt 0
    streams = {m: stream(idx[m], seed) for m in members}
    seeds = [s for m in members for _, s in streams[m]]
    assert len(set(seeds)) == len(seeds)  # across nodes and across batches (rounds)
    assert all(stream(idx[m], seed) == streams[m] for m in members)  # deterministic per node
    assert stream(idx["0xa1"], seed + 1) != streams["0xa1"]  # a new attempt, a new stream
    for m in members:
        batch_items = {i for items, _ in streams[m] for i in items}
        assert batch_items <= set(idx[m].tolist())  # a node only trains on its shard


def test_grpo_nodes_sample_different_rollouts(tmp_path):
    b = grpo_backend(tmp_path, tasks.last_letter(100, length=4, seed=0))
    members = ["0xa1", "0xb2"]
    its = [b.batches(shard.assign(b.n_items(), 7, 0, members, m), 4, 7000) for m in members]
    first = [next(it) for it in its]
    assert first[0][3] != first[1][3]  # each batch carries its node's sampling seed
    again = next(b.batches(shard.assign(b.n_items(), 7, 0, members, "0xa1"), 4, 7000))
    assert again[3] == first[0][3] and torch.equal(again[0], first[0][0])


# ---------------------------------------------------------------- small shards


def test_cpt_shard_smaller_than_the_batch_still_yields(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(bytes(range(32, 127)) * 40)
    b = make_backend(tiny_job("cpt", path))
    idx = torch.tensor([0, 3, 5])
    batches = list(itertools.islice(b.batches(idx, 8, seed=0), 4))
    assert [x.shape[0] for x, _ in batches] == [3, 3, 3, 3]  # the whole shard per batch
    x, _ = b.data.windows(idx)
    for bx, by in batches:
        assert sorted(map(tuple, bx.tolist())) == sorted(map(tuple, x.tolist()))
        assert torch.equal(bx[:, 1:], by[:, :-1])
    with pytest.raises(DatasetError, match="no items"):
        next(b.batches(torch.tensor([], dtype=torch.long), 8, seed=0))


# ---------------------------------------------------------------- GRPO: free-text completions

EOS = finetune.EOS


def free_backend(tmp_path, problems, **opts):
    return grpo_backend(tmp_path, problems, grpo_completions="free", **opts)


def test_free_grpo_samples_the_policy_and_stops_at_eos(tmp_path):
    """After ':' the policy puts P_ANSWER on 'c' (else 'a'), after either letter EOS: the share
    of completions that read "c" is P_ANSWER, every completion is one letter then EOS, the
    tokens after EOS are masked out, and the teacher-forced pi_old scores the same positions."""
    b = free_backend(tmp_path, tasks.last_letter(300, length=4, seed=0), grpo_max_new_tokens=4)
    table = torch.full((VOCAB, VOCAB), float("-inf"))
    table[:, EOS] = 0.0
    table[tok(":")] = float("-inf")
    table[tok(":"), tok("c")] = math.log(P_ANSWER)
    table[tok(":"), tok("a")] = math.log(1 - P_ANSWER)
    b.model = Bigram(table)
    n = 4000
    ids, mask = prompt_batch("abcd:", n)
    comp, cmask = b.sample(ids, mask, seed=0)
    texts = [b._text(r) for r in comp.tolist()]
    assert set(texts) == {"a", "c"} and (comp[:, 1] == EOS).all()
    assert cmask[:, :2].all() and not cmask[:, 2:].any()  # nothing sampled after EOS counts
    hits = sum(t == "c" for t in texts) / n
    assert abs(hits - P_ANSWER) < 4.5 * math.sqrt(P_ANSWER * (1 - P_ANSWER) / n), hits
    lp = b._logps(b.model, ids[:1], mask[:1], comp[:1], cmask[:1])
    want = P_ANSWER if texts[0] == "c" else 1 - P_ANSWER
    assert lp.sum().exp().item() == pytest.approx(want, rel=1e-5)


def test_free_grpo_scores_the_recipe_reward_and_steps_towards_it(tmp_path):
    torch.manual_seed(0)
    b = free_backend(
        tmp_path, tasks.last_letter(100, length=4, seed=0), grpo_max_new_tokens=3, reward="regex"
    )
    batch = next(b.batches(torch.arange(b.n_items()), 8, seed=0))
    b.reward = lambda text, answer: float(len(text) > 0 and ord(text[0]) % 2 == 0)
    ids, mask, comp, cmask, old, _, adv = b.rollout(batch)
    g = b.opts.grpo_group
    texts = [b._text(r) for r in comp.tolist()]
    rewards = torch.tensor([b.reward(t, "") for t in texts])
    expect = losses.group_advantages(rewards.reshape(-1, g)).reshape(-1)
    assert (expect != 0).any() and torch.allclose(adv, expect)
    opt = torch.optim.SGD(b.model.parameters(), lr=0.1)
    b.loss(batch).backward()
    opt.step()
    with torch.no_grad():
        new = b._logps(b.model, ids, mask, comp, cmask).sum(-1)
    assert (expect * (new - old.sum(-1))).sum().item() > 0


def test_grpo_answers_of_several_widths_need_free_completions(tmp_path):
    problems = tasks.addition(60, digits=1, seed=0)  # answers "0".."18": one or two digits
    with pytest.raises(DatasetError, match='grpo_completions = "free"'):
        grpo_backend(tmp_path, problems)
    b = free_backend(tmp_path, problems, reward="numeric")
    assert isinstance(b, finetune.FreeGRPOBackend)
    got = b.evaluate()
    assert 0 <= got["accuracy"] <= 1 and 0 < got["mean_reward"] < 1
