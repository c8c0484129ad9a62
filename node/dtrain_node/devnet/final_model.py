"""The caller's side of the end: fetch the final checkpoint from the operators (`dtrain job
fetch`, which verifies it against its on-chain hash), load it with transformers, evaluate it
against the initial model with the job's method and let it generate."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dtrain import JobSpec

    from .report import Checks

FETCH_TIMEOUT = 180
LOSS_TOLERANCE = 1e-3  # through the exported tokenizer vs training's loss (float32 noise)
CPT_WINDOWS = 32  # held-out windows of the tokenizer check (CausalLMBackend evaluates 32)
GEN_PROMPTS, PROMPT_CHARS, GEN_CHARS = 32, 80, 24  # CPT's held-out prompts for generation


def fetch(rpc: str, contract: str, job_id: int, out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dtrain.cli", "--rpc-url", rpc, "--contract", contract]
    cmd += ["--json", "job", "fetch", str(job_id), "--out", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT)


def fetch_and_evaluate(
    rpc: str, contract: str, spec: JobSpec, job_id: int, out: Path, checks: Checks
) -> dict[str, Any]:
    """The result's keys about the caller's copy (none when it could not be fetched)."""
    fetched = fetch(rpc, contract, job_id, out)
    checks.add(
        "caller fetched the final checkpoint",
        fetched.returncode == 0,
        fetched.stderr.strip()[-300:],
    )
    if fetched.returncode != 0:
        return {}
    return {"final_model_dir": str(out), **evaluate_export(out, spec, job_id, checks)}


def evaluate_export(
    out: Path, spec: JobSpec, job_id: int, checks: Checks, local_model: str | None = None
) -> dict[str, Any]:
    """Loads the caller's copy with transformers and checks what came out: the job's method
    scores it better than the initial model (held-out loss for CPT/SFT/DPO), its own tokenizer
    gives the training-side held-out loss, and its greedy continuations of held-out prompts
    match the held-out continuations better than the initial model's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dtrain_node.train.backend import TrainJob, make_backend
    from dtrain_node.train.job import load_recipe

    local_model = local_model or spec.model_uri
    recipe = load_recipe(spec.recipe_hash, spec.recipe_uri)
    method = spec.method.name.lower()
    backend = make_backend(
        TrainJob(job_id, method, local_model, spec.dataset_uri, spec.dataset_hash, recipe=recipe)
    )
    start = copy.deepcopy(backend.model).eval()
    before = backend.evaluate()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    backend.model.load_state_dict(model.state_dict())
    after = backend.evaluate()
    result: dict[str, Any] = {"eval_before": before, "eval_after": after}
    if "heldout_loss" in after:
        checks.add(
            "held-out loss went down",
            after["heldout_loss"] < before["heldout_loss"],
            f"{before['heldout_loss']:.3f} -> {after['heldout_loss']:.3f}",
        )
        result["heldout_loss_before"] = before["heldout_loss"]
        result["heldout_loss_after"] = after["heldout_loss"]
    result.update(tokenizer_check(model, start, tok, backend, checks))
    result.update(generation_check(model, start, tok, backend, checks))
    print(f"\nevaluation before {before} after {after}")
    print(f"greedy continuation of a held-out prompt: {result['sample']}")
    return result


def tokenizer_check(model, start, tok, backend, checks: Checks) -> dict[str, Any]:
    """The exported model, fed held-out data through its own tokenizer (and chat template),
    scores exactly what training's evaluation scores on the same data."""
    got = tokenizer_loss(model, start, tok, backend)
    if got is None:  # GRPO has no held-out loss
        return {}
    via_tok, training = got
    checks.add(
        "exported tokenizer gives the training-side held-out loss",
        abs(via_tok - training) <= LOSS_TOLERANCE,
        f"{via_tok:.5f} through the tokenizer vs {training:.5f} in training",
    )
    return {"heldout_loss_via_tokenizer": via_tok, "heldout_loss_training_side": training}


def tokenizer_loss(model, start, tok, backend) -> tuple[float, float] | None:
    """(held-out loss of `model` on ids from `tok`, training's loss on the same data) of the
    backend's method; `start` is DPO's frozen reference. None for GRPO (no held-out loss)."""
    import torch

    from dtrain_node.train import corpus, losses
    from dtrain_node.train.finetune import Coder, collate_labelled

    method = backend.job.method
    with torch.no_grad():
        if method == "cpt":
            text = heldout_text(backend)
            ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"])
            x, y = corpus.TextData(ids, ids, backend.ctx).heldout_windows(CPT_WINDOWS)
            via_tok = losses.cpt_loss(model(input_ids=x).logits, y)
            if backend.start.byte_level:
                raw = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8).long()
            else:
                raw = backend.data.heldout
            training = backend.loss(corpus.TextData(raw, raw, x.size(1)).heldout_windows(len(x)))
            return float(via_tok), float(training)
        if method not in ("sft", "dpo"):
            return None
        recs = backend.eval_recs
        coder = Coder(tok)  # the exported tokenizer, formatting as training does
        if method == "sft":
            pairs = [(r["prompt"], r["completion"]) for r in recs]
            ids, labels, mask = collate_labelled(coder, pairs)
            logits = model(input_ids=ids, attention_mask=mask).logits
            return float(losses.sft_loss(logits, labels)), backend.evaluate()["heldout_loss"]
        pairs = [(r["prompt"], r["chosen"]) for r in recs]
        pairs += [(r["prompt"], r["rejected"]) for r in recs]
        ids, labels, mask = collate_labelled(coder, pairs)
        pol, ref = (
            losses.sequence_logps(m(input_ids=ids, attention_mask=mask).logits, labels)
            for m in (model, start)
        )
        b = len(recs)
        loss = losses.dpo_loss(pol[:b], pol[b:], ref[:b], ref[b:], backend.opts.dpo_beta)[0]
        return float(loss), backend.evaluate()["heldout_loss"]


def heldout_text(backend) -> str:
    """The CPT held-out split as text: the decoded tokens of a model with its own tokenizer;
    for the byte-level models, from its first whole UTF-8 character (the split between training
    and held-out bytes may cut one)."""
    if not backend.start.byte_level:
        return backend.start.tokenizer.decode(backend.data.heldout.tolist())
    data = bytes(backend.data.heldout.tolist())
    first = next(i for i, b in enumerate(data) if b & 0xC0 != 0x80)
    return data[first:].decode("utf-8", "ignore")


def generation_check(model, start, tok, backend, checks: Checks) -> dict[str, Any]:
    """Greedy continuations of held-out prompts against the held-out continuations, for the
    exported model and the initial one. For the methods that train the likelihood of the data
    (CPT, SFT) the exported model must match more of them; DPO and GRPO, trained from a random
    model on preferences or rewards only, need not generate the reference, so there it is
    reported but not checked. Neither is it for a caller's own model (`--model`): how well a
    model generates after the demo's few steps is the model's and the data's, not the system's;
    there the check is that it generates at all."""
    pairs = heldout_pairs(backend)
    raw = backend.job.method == "cpt"
    trained, samples = continuation_match(model, tok, pairs, raw)
    untrained, _ = continuation_match(start, tok, pairs, raw)
    if not backend.start.byte_level:
        checks.add(
            "the caller's trained model generates",
            len(samples) == len(pairs),
            f"{trained:.3f} vs {untrained:.3f} of the reference characters (reported)",
        )
    elif backend.job.method in ("cpt", "sft"):
        checks.add(
            "greedy continuations match held-out text better than the initial model's",
            trained > untrained,
            f"{trained:.3f} vs {untrained:.3f} of the reference characters",
        )
    prompt, ref = pairs[0]
    shown = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    return {
        "continuation_match": trained,
        "continuation_match_before": untrained,
        "sample": {"prompt": shown[-40:], "reference": ref, "generated": samples[0]},
    }


def heldout_pairs(backend) -> list[tuple[str | list[dict[str, str]], str]]:
    """(prompt, reference continuation) pairs: CPT cuts its held-out text into GEN_PROMPTS
    prompts of PROMPT_CHARS characters, each followed by GEN_CHARS reference characters; the
    other methods take their held-out records' prompts (as a chat) and the response, chosen
    answer or answer."""
    if backend.job.method == "cpt":
        text = heldout_text(backend)
        step = max(1, (len(text) - PROMPT_CHARS - GEN_CHARS) // GEN_PROMPTS)
        cuts = range(0, len(text) - PROMPT_CHARS - GEN_CHARS + 1, step)
        return [
            (text[c : c + PROMPT_CHARS], text[c + PROMPT_CHARS : c + PROMPT_CHARS + GEN_CHARS])
            for c in list(cuts)[:GEN_PROMPTS]
        ]
    key = {"sft": "completion", "dpo": "chosen", "grpo": "answer"}[backend.job.method]
    return [(r["prompt"], r[key]) for r in backend.eval_recs]


def continuation_match(model, tok, pairs, raw: bool) -> tuple[float, list[str]]:
    """The share of the reference characters that the model's greedy continuations reproduce
    before their first difference (prompts encoded and continuations decoded by `tok`; a chat
    prompt through its chat template), and the continuations. One left-padded batch."""
    import torch

    from dtrain_node.train.finetune import Coder, left_pad

    coder = Coder(tok)  # prompts as training formats them, through the exported tokenizer
    # CPT continues raw text; the other methods' prompts are formatted as records are.
    rows = [coder.encode(p) if raw else coder.prompt(p) for p, _ in pairs]
    max_new = max(len(ref.encode()) for _, ref in pairs)
    keep = model.config.max_position_embeddings - max_new  # the prompt's end fits the context
    ids, mask = left_pad([r[-keep:] for r in rows], coder.pad)
    with torch.no_grad():
        gen = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            do_sample=False,
            pad_token_id=coder.pad,
        )
    new = gen[:, ids.size(1) :]
    outs = [tok.decode(row, skip_special_tokens=True) for row in new]
    matched = sum(common_prefix(out, ref) for out, (_, ref) in zip(outs, pairs, strict=True))
    return matched / max(1, sum(len(ref) for _, ref in pairs)), outs


def common_prefix(a: str, b: str) -> int:
    """The number of leading characters `a` and `b` share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
