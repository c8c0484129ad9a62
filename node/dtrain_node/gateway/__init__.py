"""`dtrain gateway`: training jobs bought over x402 (app.py the HTTP API, cli.py the command)."""
