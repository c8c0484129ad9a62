"""x402 payments as the official client makes them, for tests that send them by hand."""

from __future__ import annotations

from x402 import x402ClientSync
from x402.http.utils import encode_payment_signature_header
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.schemas import PaymentRequired, PaymentRequirements

from dtrain.client import load_key


def payment_for(key: str, req: PaymentRequirements) -> str:
    """The `PAYMENT-SIGNATURE` header value the official client makes for `req`."""
    client = x402ClientSync()
    register_exact_evm_client(client, load_key(key))
    client.set_spend_controls(False)
    payload = client.create_payment_payload(PaymentRequired(accepts=[req]))
    return encode_payment_signature_header(payload)
