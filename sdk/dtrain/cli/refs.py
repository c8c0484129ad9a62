"""A job's references as `data check` and `job submit` read them, and what the job pins.

A local path is read where it is. A p2p: or https: URI (with `#sha256=`) is fetched by that hash
into the cache as a node fetches it (`dtrain_node.operator.sources`): a folder the caller serves
with `dtrain data serve` from the same cache is already there as its pack and is read without a
transfer. The dataset and model are then checked on those copies exactly as local files are
(`pins.check_job_inputs`), so a URI needs no hash made by hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import pins
from ..errors import ConfigError
from ..recipe import ZERO_HASH, Recipe
from .root import _hex32

DEFAULT_MODEL = "builtin:tiny"  # `job submit`'s, and the model `data check` builds a job on
DEFAULT_CACHE = "~/.dtrain/cache"  # the node's fetch cache, and where `data serve` packs folders


class References:
    """Local copies of a job's references, fetched the first time each is asked for; use it as
    a context manager (it stops the fetching libp2p host it may have started)."""

    def __init__(self, cache_dir: Path | str = DEFAULT_CACHE) -> None:
        self.cache_dir = Path(cache_dir).expanduser()
        self._fetcher: Any = None

    def __enter__(self) -> References:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fetcher is not None:
            self._fetcher.close()
            self._fetcher = None

    def model(self, uri: str) -> str:
        """A model reference loadable here: a fetched pack becomes a folder in the cache."""
        if not pins.is_remote(uri):
            return uri
        return self._fetch(lambda f: f.model(uri))

    def file(self, uri: str, what: str) -> str:
        """The local path of the dataset or recipe file `uri` names."""
        if not pins.is_remote(uri):
            return uri.removeprefix("file://")
        if pins.uri_sha256(uri) is None:
            raise ConfigError(
                f"{what} {uri}: a p2p: or https: reference needs #sha256=<hex> (as `dtrain data "
                "serve` prints it) for the file to be fetched and checked"
            )
        return str(self._fetch(lambda f: f.file(uri, None, what)))

    def _fetch(self, get: Any) -> Any:
        try:
            from dtrain_node.errors import NodeError
            from dtrain_node.operator.sources import Cache, Fetcher
        except ImportError as exc:
            raise ConfigError(
                "a p2p: or https: reference is fetched to be checked, which needs the node "
                f"package (libp2p): pip install 'dtrain[node]' ({exc})"
            ) from None
        if self._fetcher is None:
            self._fetcher = Fetcher(Cache(self.cache_dir))
        try:
            return get(self._fetcher)
        except NodeError as exc:
            raise ConfigError(f"{exc} (nothing was sent)") from None


@dataclass(frozen=True)
class JobPins:
    """What a job pins for its references, and what checking them found."""

    model: bytes
    dataset: bytes
    recipe: Recipe | None
    summary: str  # the dataset's, "" when it was pinned by hand (not read)
    # the members' sync as checked: top-k per chunk, packet bytes, parameters synced
    sync: dict[str, int] | None = None

    @property
    def recipe_hash(self) -> bytes:
        return self.recipe.hash() if self.recipe else ZERO_HASH


@dataclass(frozen=True)
class Wanted:
    """A job's references as given, and the hashes given by hand (`--model-hash`, ...)."""

    method: str
    model_uri: str
    dataset_uri: str
    recipe_uri: str = ""
    model_hash: str = ""
    dataset_hash: str = ""
    compression: tuple[int, int, int] | None = None  # top-k per chunk, bits, seats
    fit_topk: bool = False  # the top-k is a default: lowered to fit the gossip limit


def pin_job(refs: References, w: Wanted) -> JobPins:
    """Reads (or fetches) each reference, validates the job's inputs (`pins.check_job_inputs`,
    unless a hash given by hand vouches for a file only the operators have) and returns the
    pins; a ConfigError, before any transaction, when the job could not train."""
    recipe = Recipe.from_toml(refs.file(w.recipe_uri, "recipe")) if w.recipe_uri else None
    dataset = None if w.dataset_hash else refs.file(w.dataset_uri, "dataset")  # None: not read
    if dataset is not None:
        data_pin = pins.dataset_hash(dataset)
    else:
        data_pin = _hex32(w.dataset_hash, "--dataset-hash")
        _agrees(w.dataset_uri, data_pin)
    if w.model_hash:
        model_pin = _hex32(w.model_hash, "--model-hash")
        summary = "" if dataset is None else pins.check_dataset(dataset, w.method, recipe)
    elif dataset is not None:
        summary, model_pin, sync = pins.check_job_inputs(
            refs.model(w.model_uri), dataset, w.method, recipe, w.compression, w.fit_topk
        )
        return JobPins(model_pin, data_pin, recipe, summary, sync)
    else:
        model_pin, summary = pins.model_hash(refs.model(w.model_uri)), ""
    return JobPins(model_pin, data_pin, recipe, summary)


def _agrees(uri: str, pinned: bytes) -> None:
    """A dataset URI naming another sha256 than --dataset-hash: every node would refuse it."""
    named = pins.uri_sha256(uri) if pins.is_remote(uri) else None
    if named is not None and named != pinned:
        raise ConfigError(
            f"--dataset-hash 0x{pinned.hex()} is not the sha256 {named.hex()} that --dataset-uri "
            "names: every operator would refuse the job (leave --dataset-hash out)"
        )
