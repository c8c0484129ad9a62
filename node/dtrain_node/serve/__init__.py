"""`dtrain serve JOB`: an OpenAI-compatible HTTP API over a completed job's final model.

The model is the job's final checkpoint, verified against its on-chain hash (`source`), loaded
by an `Engine` (`engine`: transformers here; vLLM is the seam for later) and served by a FastAPI
app (`app.create_app`) whose every generating call first asks a `Payment` (`payment`: `Free`
here; x402 is the seam for later) whether to go ahead.
"""
