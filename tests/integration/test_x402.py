"""x402 on anvil through the official `x402` package: a local facilitator that settles with
TestUSD's `transferWithAuthorization`, the SDK's `Paywall`, and `dtrain serve`'s `X402`
payment used by the official `openai` client. Attacks first: a payment that underpays, pays
someone else, pays in another token, has expired, or is replayed (after settling or while in
flight) is refused and moves nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from harness.payments import payment_for
from harness.served import served
from openai import AsyncOpenAI, OpenAI
from x402.http.utils import decode_payment_required_header, encode_payment_signature_header
from x402.schemas import PaymentPayload, PaymentRequirements

from dtrain.chain import DevAccount, LocalChain
from dtrain.client import load_key
from dtrain.devtoken import UNIT, TestUSD
from dtrain.x402 import (
    MULTICALL3,
    LocalFacilitator,
    PaymentRefused,
    Paywall,
    Token,
    install_multicall,
    paying_http_client,
    paying_http_client_sync,
    settlement_of,
)
from dtrain_node.serve.config import ServeConfig
from dtrain_node.serve.engine import TransformersEngine
from dtrain_node.serve.payment import X402
from dtrain_node.train.toy_models import save

PAYER, PAYEE, FACILITATOR, OTHER = 5, 6, 7, 8
PRICE = 50_000  # 0.05 TestUSD
MODEL = "dtrain-job-3"


@dataclass
class Devnet:
    usd: TestUSD
    token: Token
    facilitator: LocalFacilitator
    paywall: Paywall
    payer: DevAccount
    payee: str

    def balances(self) -> tuple[int, int]:
        return self.usd.balance_of(self.payer.address), self.usd.balance_of(self.payee)


@pytest.fixture
def devnet(chain: LocalChain, accounts: list[DevAccount], bsm) -> Devnet:  # bsm: EVM snapshot
    assert install_multicall(bsm.w3)
    assert not install_multicall(bsm.w3)  # once there, left alone
    usd = TestUSD.deploy(chain.url, accounts[0].key)
    usd.mint(accounts[PAYER].address, 10 * UNIT)
    token = Token.read(bsm.w3, usd.address)
    facilitator = LocalFacilitator(chain.url, accounts[FACILITATOR].key)
    paywall = Paywall(facilitator, token, accounts[PAYEE].address)
    return Devnet(usd, token, facilitator, paywall, accounts[PAYER], accounts[PAYEE].address)


def signed(d: Devnet, req: PaymentRequirements, **change) -> str:
    """A payment header whose `accepted` is `req` but whose authorization is built by hand,
    with `change`d fields (to, value, valid_before, nonce, token)."""
    usd: TestUSD = change.pop("token", d.usd)
    auth = usd.sign_authorization(
        load_key(d.payer.key),
        change.get("to", req.pay_to),
        change.get("value", int(req.amount)),
        valid_before=change.get("valid_before", int(time.time()) + 300),
        nonce=change.get("nonce"),
    )
    inner = {
        "authorization": {
            "from": auth.sender,
            "to": auth.to,
            "value": str(auth.value),
            "validAfter": str(auth.valid_after),
            "validBefore": str(auth.valid_before),
            "nonce": "0x" + auth.nonce.hex(),
        },
        "signature": "0x" + auth.signature.hex(),
    }
    return encode_payment_signature_header(PaymentPayload(payload=inner, accepted=req))


def official(d: Devnet, req: PaymentRequirements) -> str:
    """The payment header the official client makes for `req`."""
    return payment_for(d.payer.key, req)


def refused(d: Devnet, header: str | None, req: PaymentRequirements) -> str:
    with pytest.raises(PaymentRefused) as err:
        asyncio.run(d.paywall.verify(header, req))
    return err.value.reason


# ------------------------------------------------------------------------------------ attacks


def test_payments_that_do_not_pay_the_price_are_refused_and_move_nothing(
    devnet: Devnet, chain: LocalChain, accounts: list[DevAccount]
) -> None:
    d, req = devnet, devnet.paywall.requirements(PRICE)
    before = d.balances()
    other_usd = TestUSD.deploy(chain.url, accounts[0].key)
    other_usd.mint(d.payer.address, 10 * UNIT)
    cases = {
        "underpaying": signed(d, req, value=PRICE - 1),
        "to another payee": signed(d, req, to=accounts[OTHER].address),
        "in another token": signed(d, req, token=other_usd),
        "expired": signed(d, req, valid_before=int(time.time()) - 1),
        "about to expire": signed(d, req, valid_before=int(time.time()) + 2),
    }
    reasons = {name: refused(d, header, req) for name, header in cases.items()}
    assert reasons == {
        "underpaying": "invalid_exact_evm_payload_authorization_value_mismatch",
        "to another payee": "invalid_exact_evm_payload_recipient_mismatch",
        "in another token": "invalid_exact_evm_payload_signature",
        "expired": "invalid_exact_evm_payload_authorization_valid_before",
        "about to expire": "invalid_exact_evm_payload_authorization_valid_before",
    }, reasons
    # The client's `accepted` says less than we ask: refused before the facilitator is asked.
    cheap = req.model_copy(update={"amount": str(PRICE - 1)})
    assert refused(d, signed(d, cheap), req) == "payment_mismatch"
    elsewhere = req.model_copy(update={"pay_to": accounts[OTHER].address})
    assert refused(d, signed(d, elsewhere, to=accounts[OTHER].address), req) == "payment_mismatch"
    assert refused(d, None, req) == "payment_required"
    assert refused(d, "bm90IHg0MDI=", req) == "invalid_payload"
    assert d.balances() == before
    assert other_usd.balance_of(d.payer.address) == 10 * UNIT


def test_a_payment_pays_once_replayed_after_settling_or_while_in_flight(devnet: Devnet) -> None:
    d, req = devnet, devnet.paywall.requirements(PRICE)
    header = official(d, req)
    verified = asyncio.run(d.paywall.verify(header, req))
    assert refused(d, header, req) == "payment_already_used"  # in flight: claimed
    settled = asyncio.run(d.paywall.settle(verified))
    assert d.balances() == (10 * UNIT - PRICE, PRICE)
    assert refused(d, header, req) == "payment_already_used"
    # A fresh paywall (another process) has no claims: the chain refuses the used nonce.
    fresh = Paywall(d.facilitator, d.token, d.payee)
    with pytest.raises(PaymentRefused) as err:
        asyncio.run(fresh.verify(header, req))
    assert err.value.reason == "invalid_exact_evm_nonce_already_used", err.value
    assert d.balances() == (10 * UNIT - PRICE, PRICE)
    receipt = d.usd.w3.eth.get_transaction_receipt(settled.transaction)
    assert receipt["status"] == 1 and receipt["from"] == d.facilitator.address


def test_a_payer_without_the_balance_is_refused(devnet: Devnet, accounts: list[DevAccount]) -> None:
    d = devnet
    req = d.paywall.requirements(11 * UNIT)  # the payer holds 10
    assert refused(d, official(d, req), req) == "invalid_exact_evm_insufficient_balance"
    assert d.balances() == (10 * UNIT, 0)


def test_multicall_is_the_devnet_contract_at_the_fixed_address(devnet: Devnet) -> None:
    from x402.mechanisms.evm.multicall import MulticallCall, multicall

    calls = [
        MulticallCall(
            address=devnet.usd.address,
            abi=devnet.usd.contract.abi,
            function_name="balanceOf",
            args=(devnet.payer.address,),
        ),
        MulticallCall(
            address=devnet.usd.address, abi=devnet.usd.contract.abi, function_name="transfer"
        ),
    ]
    calls[1].args = (devnet.payee, 1)  # from the multicall itself, which holds nothing
    ok, failed = multicall(devnet.facilitator.signer, calls)
    assert ok.success and ok.result == 10 * UNIT
    assert not failed.success and "revert" in str(failed.error)
    assert len(devnet.usd.w3.eth.get_code(MULTICALL3)) > 0


# --------------------------------------------------------------------- paid serving, in process


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> TransformersEngine:
    folder = tmp_path_factory.mktemp("toy") / "gpt2"
    save("gpt2", folder)
    return TransformersEngine(folder)


@pytest.fixture
def url(devnet: Devnet, engine: TransformersEngine) -> Iterator[str]:
    payment = X402(devnet.paywall, PRICE, f"a completion from {MODEL}")
    with served(engine, ServeConfig(3, bytes(32), max_tokens_cap=64), payment) as u:
        yield u


def test_the_openai_client_unpaid_gets_a_402_with_the_requirements(
    devnet: Devnet, url: str
) -> None:
    client = OpenAI(base_url=url, api_key="unused", max_retries=0)
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model=MODEL, prompt="def ", max_tokens=4)
    r = err.value.response
    assert r.status_code == 402 and err.value.body["code"] == "payment_required"
    required = decode_payment_required_header(r.headers["payment-required"])
    [req] = required.accepts
    assert (req.scheme, req.network) == ("exact", devnet.facilitator.network)
    assert (int(req.amount), req.asset, req.pay_to) == (PRICE, devnet.usd.address, devnet.payee)
    assert req.extra["name"] == "TestUSD" and req.extra["version"] == "2"
    assert r.json()["accepts"][0]["payTo"] == devnet.payee
    assert client.models.list().data[0].id == MODEL  # listing is free
    assert devnet.balances() == (10 * UNIT, 0)


def test_the_async_openai_client_paying_gets_completions_for_exactly_the_price(
    devnet: Devnet, url: str
) -> None:
    payer = load_key(devnet.payer.key)

    async def calls() -> tuple[str, str]:
        async with paying_http_client(payer, PRICE, devnet.usd.address) as http:
            client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, http_client=http)
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            settlement = settlement_of(raw.http_response)
            answer = raw.parse().choices[0].message.content
            stream = await client.completions.create(
                model=MODEL, prompt="x = ", max_tokens=4, stream=True
            )
            streamed = "".join([c.choices[0].text async for c in stream])
        assert (
            settlement is not None
            and settlement["success"]
            and settlement["payer"] == payer.address
        )
        return answer, streamed

    answer, streamed = asyncio.run(calls())
    assert isinstance(answer, str) and isinstance(streamed, str)
    assert devnet.balances() == (10 * UNIT - 2 * PRICE, 2 * PRICE)


def test_the_sync_client_pays_nothing_above_its_cap_or_in_another_token(
    devnet: Devnet, url: str
) -> None:
    payer = load_key(devnet.payer.key)
    for http in (
        paying_http_client_sync(payer, PRICE - 1, devnet.usd.address),
        paying_http_client_sync(payer, PRICE, MULTICALL3),  # only pays in another token
    ):
        client = OpenAI(base_url=url, api_key="unused", max_retries=0, http_client=http)
        with pytest.raises(PaymentRefused) as err:
            client.completions.create(model=MODEL, prompt="a", max_tokens=2)
        assert err.value.reason == "payment_not_made" and "spend_controls" in str(err.value)
    assert devnet.balances() == (10 * UNIT, 0)
    with paying_http_client_sync(payer, PRICE, devnet.usd.address) as http:
        client = OpenAI(base_url=url, api_key="unused", max_retries=0, http_client=http)
        r = client.completions.create(model=MODEL, prompt="a", max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert devnet.balances() == (10 * UNIT - PRICE, PRICE)


def test_a_replayed_payment_header_buys_no_second_answer(devnet: Devnet, url: str) -> None:
    req = devnet.paywall.requirements(PRICE)
    header = official(devnet, req)
    body = {"model": MODEL, "prompt": "a", "max_tokens": 2}
    first = httpx.post(f"{url}/completions", json=body, headers={"X-PAYMENT": header}, timeout=60)
    assert first.status_code == 200 and first.headers["payment-response"]
    again = httpx.post(
        f"{url}/completions", json=body, headers={"PAYMENT-SIGNATURE": header}, timeout=60
    )
    assert again.status_code == 402 and again.json()["error"]["code"] == "payment_already_used"
    assert devnet.balances() == (10 * UNIT - PRICE, PRICE)


class Draining:
    """An engine whose first generation runs `first()` before generating (the payer acting
    while its answer is generated)."""

    def __init__(self, engine: TransformersEngine, first) -> None:
        self.engine, self.first = engine, first
        self.name, self.context = engine.name, engine.context

    def prompt_ids(self, prompt):
        return self.engine.prompt_ids(prompt)

    def generate(self, ids, sampling, cancelled):
        if self.first is not None:
            self.first, first = None, self.first
            first()
        yield from self.engine.generate(ids, sampling, cancelled)


def test_a_payment_that_cannot_settle_withholds_the_answer(
    devnet: Devnet, engine: TransformersEngine, accounts: list[DevAccount]
) -> None:
    """Verified, then the payer empties its balance while the answer is generated."""
    payer_usd = devnet.usd.with_account(devnet.payer.key)
    drain = Draining(engine, lambda: payer_usd.transfer(accounts[OTHER].address, 10 * UNIT))
    payment = X402(devnet.paywall, PRICE, "a completion")
    header = official(devnet, devnet.paywall.requirements(PRICE))
    with served(drain, ServeConfig(3, bytes(32), max_tokens_cap=64), payment) as u:
        r = httpx.post(
            f"{u}/completions",
            json={"model": MODEL, "prompt": "a", "max_tokens": 2},
            headers={"PAYMENT-SIGNATURE": header},
            timeout=60,
        )
    assert drain.first is None  # it ran
    assert r.status_code == 402 and "choices" not in r.json(), r.text
    assert r.json()["error"]["code"] == "transaction_failed"
    assert devnet.balances() == (0, 0)
