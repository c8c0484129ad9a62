"""The defaults the documentation states are the CLI's.

The CLI side is read from the click command objects themselves: the `dtrain` group with every
command the `dtrain.cli` entry points register into it (the node's `node run`, `job fetch`,
`data serve`, `serve`, `gateway`, `attest ...`), walked recursively. The docs side is every
place in README.md and docs/*.md that states an option's default:

- "`--round-deadline`, default 20 s", "`--linger` (default `1h`; ...)", "(`--epochs`, default 1)",
  "`--operators MIN:MAX` needs ... (default `2:3`)", "`--cache-dir` (default `DATA_DIR/cache`)";
- "`--max-tokens-cap` (512 by default)";
- "`--seat-bond` defaults to the deployment's minimum";
- "`--port` (4100)", "`--key-file` (`~/.dtrain/data-peer.key`)": a bare value in parentheses
  right after the option;
- a shell comment: "# --port N, default 8765", "--facilitator-key KEY  # ...; default --key".

The option a statement is about is the nearest option named before it in the same sentence (or
shell line); the command, when several commands have an option of that name, is the nearest
command named before it in the same section that has it (`dtrain job watch ...`, `data serve`).
A documented value is read with the option's own parameter type (amounts as `dtrain.inputs`
reads them, so 0.01 ETH = 0.01ether = 10**16 wei; durations, so 1h = 3600 = 60m; floats, so
20 s = 20 = 20.0); an option without a value default (None) is compared with the prose default
of its help text ("[default: DATA_DIR/cache]"). A sentence that names an option and says
"default" within 60 characters after it, in a form none of these patterns reads, fails the
test too, so a default cannot hide from it in new wording (not counted: "the/its default",
"X's default", or a default of another code name in between, "`commit_share` default 0.75").

The reverse, for the CLI's own help: an option whose help states a default in prose agrees with
its actual default, and the three drifts of the caller's journey stay fixed (`--model-uri`'s
help names every kind of model URI the node starts from, `--x402`'s help reads `--price` in
whole tokens as the code does, `--round-deadline`'s default is the documented one).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from dtrain import cli as sdk_cli
from dtrain.inputs import parse_duration

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


# ---------------------------------------------------------------------------------- CLI side


@dataclass(frozen=True)
class CliOption:
    command: str  # "job submit", "" for the root group
    param: click.Option

    @property
    def label(self) -> str:
        return f"dtrain {self.command} {self.param.opts[-1]}".replace("  ", " ")


def _walk(group: click.Command, path: str = "") -> Iterator[tuple[str, click.Command]]:
    yield path, group
    if isinstance(group, click.Group):
        for name, sub in sorted(group.commands.items()):
            yield from _walk(sub, f"{path} {name}".strip())


def cli_commands() -> dict[str, click.Command]:
    sdk_cli._load_plugins()  # the node's commands, as `dtrain` itself loads them
    return dict(_walk(sdk_cli.cli))


def cli_options() -> dict[str, list[CliOption]]:
    """Every long option name -> the commands that have an option of that name."""
    by_name: dict[str, list[CliOption]] = {}
    for path, command in cli_commands().items():
        for param in command.params:
            if isinstance(param, click.Option):
                for name in (*param.opts, *param.secondary_opts):
                    if name.startswith("--") and name != "--help":
                        by_name.setdefault(name, []).append(CliOption(path, param))
    return by_name


def _unset(value: Any) -> bool:
    return value is None or type(value).__name__ in {"Sentinel", "_Missing"}


HELP_DEFAULT = re.compile(r"[\[(](?:env [^;\])]*; )?default:? ([^\])]+)[\])]")


def help_prose_default(param: click.Option) -> str | None:
    m = HELP_DEFAULT.search(" ".join((param.help or "").split()))
    return m.group(1) if m else None


# --------------------------------------------------------------------------------- docs side


@dataclass(frozen=True)
class Unit:
    """A paragraph, a list item, a table row or a shell line of one doc, with its section."""

    file: str
    lines: tuple[tuple[int, int], ...]  # (offset in text, line number) of each joined line
    section: int
    text: str

    @property
    def line(self) -> int:
        return self.lines[0][1]

    def line_at(self, pos: int) -> int:
        return max((n for off, n in self.lines if off <= pos), default=self.line)


LIST_ITEM = re.compile(r"^(?:[-*]|[0-9]+\.)\s")


def doc_units(path: Path) -> list[Unit]:
    units: list[Unit] = []
    section = 0
    in_code = False
    para: list[tuple[int, str]] = []

    def add(parts: list[tuple[int, str]]) -> None:
        text, offsets = "", []
        for n, part in parts:
            offsets.append((len(text), n))
            text += part + " "
        units.append(Unit(path.name, tuple(offsets), section, text.rstrip()))

    def flush() -> None:
        if para:
            add(list(para))
            para.clear()

    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            flush()
            in_code = not in_code
        elif in_code or (line.startswith("    ") and not para):  # shell, continuations joined
            flush()
            parts = [(i + 1, line.strip())]
            while parts[-1][1].endswith("\\") and i + 1 < len(lines):
                i += 1
                parts[-1] = (parts[-1][0], parts[-1][1][:-1])
                parts.append((i + 1, lines[i].strip()))
            add(parts)
        elif stripped.startswith("#"):
            flush()
            section += 1
        elif not stripped or stripped.startswith("|") or LIST_ITEM.match(stripped):
            flush()
            if stripped.startswith("|"):
                add([(i + 1, stripped)])
            elif stripped:
                para.append((i + 1, stripped))
        else:
            para.append((i + 1, stripped))
        i += 1
    flush()
    return units


OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# What ends a stated value: a closing parenthesis, a semicolon, a comma or a full stop.
VALUE = r"(?P<v>`[^`]+`|[^;,()`]+?)(?=\s*(?:[;,)]|\.(?:\s|$)|$| 0:))"
STATEMENTS = [
    # "`--linger` (default `1h`", "`--round-deadline`, default 20 s", "# ..., default 8765"
    re.compile(r"(?:[(,;#]|^)\s*default:?\s+" + VALUE),
    # "(512 by default)", ", `--port` 8765 by default"
    re.compile(r"[(,;]\s*(?:`--[a-z0-9-]+`\s+)?(?P<v>`[^`]+`|[^;,()`]+?)\s+by default\b"),
    # "`--seat-bond` defaults to the deployment's minimum"
    re.compile(r"`\s+defaults to\s+" + VALUE),
]
# "`--port` (4100)", "`--min-stake` (1 ETH)": a bare value in parentheses right after it.
BARE = re.compile(r"`(?P<o>--[a-z][a-z0-9-]*)`\s+\((?P<v>`[^`]+`|[0-9][0-9.]*(?: ?[a-zA-Z]+)?)\)")
SENTENCE_END = re.compile(r"\.\s+[A-Z`(]")
CODE_SPAN = re.compile(r"`[^`]+`")
COMMAND_MENTION = re.compile(
    r"(?:\bdtrain|`)((?:\s+--[a-z-]+(?:\s+\$?\w\S*)?)*)\s*([a-z][a-z0-9 -]*)"
)


@dataclass(frozen=True)
class Statement:
    unit: Unit
    option: str
    value: str
    pos: int

    @property
    def where(self) -> str:
        return f"{self.unit.file}:{self.unit.line_at(self.pos)}"


def _clean(value: str) -> str:
    return value.strip().strip("`").strip()


def doc_statements(units: list[Unit], names: set[str]) -> tuple[list[Statement], list[str]]:
    """The default statements of one doc, and the sentences naming an option and "default"
    that no pattern reads."""
    found: list[Statement] = []
    unread: list[str] = []
    for unit in units:
        text = unit.text
        read_at: set[int] = set()
        for m in BARE.finditer(text):
            if m.group("o") in names:
                found.append(Statement(unit, m.group("o"), _clean(m.group("v")), m.start("o")))
        for pattern in STATEMENTS:
            for m in pattern.finditer(text):
                kw = text.find("default", m.start())
                read_at.add(kw)
                option = _option_before(text, kw, names)
                if option is not None:
                    found.append(Statement(unit, option[0], _clean(m.group("v")), option[1]))
        for m in re.finditer(r"\bdefault", text):
            if m.start() in read_at or re.search(r"(?:\bits|\bthe|'s)\s+$", text[: m.start()]):
                continue
            option = _option_before(text, m.start(), names, reach=60)
            if option is None or CODE_SPAN.search(text, option[1] + len(option[0]) + 1, m.start()):
                continue  # no option just before, or the default of something else named
            where = f"{unit.file}:{unit.line_at(m.start())}"
            unread.append(f"{where}: ...{text[max(0, m.start() - 80) : m.end() + 40]}...")
    return found, unread


def _option_before(
    text: str, pos: int, names: set[str], reach: int = 160
) -> tuple[str, int] | None:
    """The option a statement at `pos` is about: the last one named before it in its sentence,
    at most `reach` characters before."""
    start = max(0, pos - reach)
    ends = list(SENTENCE_END.finditer(text, start, pos))
    if ends:
        start = ends[-1].end() - 1
    hits = [m for m in OPTION.finditer(text, start, pos) if m.group() in names]
    return (hits[-1].group(), hits[-1].start()) if hits else None


def _mentions(unit: Unit, commands: set[str], end: int | None = None) -> list[str]:
    """Commands named in a unit (before `end`), in order: `dtrain job watch`, `data serve`."""
    out = []
    text = unit.text if end is None else unit.text[:end]
    for m in COMMAND_MENTION.finditer(text):
        words = m.group(2).split()
        for n in range(min(3, len(words)), 0, -1):
            path = " ".join(words[:n])
            if path in commands:
                out.append(path)
                break
    return out


def resolve(
    st: Statement, units: list[Unit], options: dict[str, list[CliOption]], commands: set[str]
) -> CliOption | str:
    """The CLI option a statement is about, or why it cannot be told."""
    candidates = options[st.option]
    if len(candidates) == 1:
        return candidates[0]
    having = {c.command: c for c in candidates}
    before = [u for u in units if u.section == st.unit.section and u.line < st.unit.line]
    named = [p for u in before for p in _mentions(u, commands)]
    named += _mentions(st.unit, commands, st.pos)
    for path in reversed(named):
        if path in having:
            return having[path]
    defaults = {repr(c.param.default) for c in candidates}
    if len(defaults) == 1:
        return candidates[0]
    return f"{st.where}: {st.option} of which command? ({', '.join(sorted(having))})"


# ------------------------------------------------------------------------- comparing values

_UNIT_WORDS = [
    (r"\s*(?:seconds?|secs?)\b", "s"),
    (r"\s*(?:minutes?|mins?)\b", "m"),
    (r"\s*(?:hours?|hrs?)\b", "h"),
    (r"\s*days?\b", "d"),
    (r"\s*weeks?\b", "w"),
    (r"^an?\s+(?=[smhdw]$)", "1"),
]


def _seconds(text: str) -> float:
    t = text.strip().lower().replace("-", " ")
    for pattern, unit in _UNIT_WORDS:
        t = re.sub(pattern, unit, t)
    t = t.replace(" ", "")
    try:
        return float(t)
    except ValueError:
        pass
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([smhdw])", t)
    if m:
        return float(m.group(1)) * parse_duration("1" + m.group(2))
    return float(parse_duration(t))


def read_value(param: click.Option, text: Any) -> Any:
    """A value as the option's own type reads it, durations in seconds for numeric types."""
    kind = param.type
    if isinstance(kind, sdk_cli.Parsed) and kind.name == "duration":
        if isinstance(text, str):
            return _seconds(text)
        return kind.convert(text, param, None)
    if isinstance(kind, sdk_cli.Parsed):
        return kind.convert(str(text).strip(), param, None)
    if isinstance(kind, click.types.BoolParamType) or param.is_flag:
        return str(text).strip().lower() in {"true", "on", "yes", "1", param.opts[0]}
    if isinstance(kind, click.types.IntParamType | click.types.FloatParamType):
        if isinstance(text, int | float):
            return float(text)
        try:
            return float(kind.convert(str(text).strip(), param, None))
        except click.BadParameter:
            return _seconds(str(text))
    if type(kind).__name__ == "Seconds":  # the node's --linger: seconds or a duration
        return _seconds(str(text)) if isinstance(text, str) else float(text)
    return str(text).strip()


FILLER = {"a", "an", "the", "too", "also", "its", "then"}


def _words(text: str) -> set[str]:
    return set(re.sub(r"[`,.;:\"()\[\]]", " ", text.lower()).split()) - FILLER


def agrees(option: CliOption, documented: str) -> str | None:
    """None when a documented default is the option's; else what differs."""
    param = option.param
    if _unset(param.default) or param.default == "":
        prose = help_prose_default(param)
        if prose is None:
            return f"{option.label} has no default, its help states none"
        a, b = _words(documented), _words(prose)
        if a and (a <= b or b <= a):
            return None
        return f"{option.label}'s help says [default: {prose}]"
    try:
        doc = read_value(param, documented)
    except (click.BadParameter, ValueError, Exception) as exc:
        return (
            f"{option.label} cannot read {documented!r} ({exc}); its default is {param.default!r}"
        )
    cli = read_value(param, param.default)
    if doc != cli:
        return f"{option.label}'s default is {param.default!r} ({cli!r}), not {doc!r}"
    return None


# -------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def cli() -> tuple[dict[str, list[CliOption]], set[str]]:
    return cli_options(), set(cli_commands())


def collect(cli_side) -> tuple[list[tuple[Statement, CliOption | str]], list[str]]:
    options, commands = cli_side
    names = set(options)
    pairs: list[tuple[Statement, CliOption | str]] = []
    unread: list[str] = []
    for path in DOC_FILES:
        units = doc_units(path)
        found, not_read = doc_statements(units, names)
        unread += not_read
        pairs += [(st, resolve(st, units, options, commands)) for st in found]
    return pairs, unread


def test_the_cli_tree_is_walked(cli) -> None:
    options, commands = cli
    # the SDK's own commands and those the node registers into them
    assert {"job submit", "deploy", "node run", "job fetch", "data serve", "serve"} <= commands
    assert {c.command for c in options["--port"]} >= {"chain up", "data serve", "job watch"}


def test_every_documented_default_is_the_clis(cli) -> None:
    pairs, unread = collect(cli)
    problems = [p for _, p in pairs if isinstance(p, str)]
    problems += [
        f"{st.where}: {st.option} documented default {st.value!r}: {why}"
        for st, opt in pairs
        if isinstance(opt, CliOption) and (why := agrees(opt, st.value))
    ]
    problems += [f"unread default statement (reword it as the patterns read): {u}" for u in unread]
    assert not problems, "\n".join(problems)
    assert len(pairs) >= 20, [f"{st.where} {st.option}={st.value}" for st, _ in pairs]


def test_options_documented_with_a_default_show_it_in_help(cli) -> None:
    """What the docs call a default, `--help` shows: a value default has show_default, a
    prose default is in the help text."""
    pairs, _ = collect(cli)
    missing = set()
    for _, opt in pairs:
        if not isinstance(opt, CliOption):
            continue
        p = opt.param
        if _unset(p.default) or p.default == "":
            if help_prose_default(p) is None:
                missing.add(opt.label)
        elif not p.show_default and help_prose_default(p) is None:
            missing.add(opt.label)
    assert not missing, sorted(missing)


def test_help_prose_defaults_agree_with_the_defaults(cli) -> None:
    """An option with a value default whose help also states one in prose: the same value."""
    options, _ = cli
    seen = {id(o.param): o for group in options.values() for o in group}
    wrong = []
    for opt in seen.values():
        prose = help_prose_default(opt.param)
        if prose is None or _unset(opt.param.default) or opt.param.default == "":
            continue
        try:
            if read_value(opt.param, prose) != read_value(opt.param, opt.param.default):
                wrong.append(f"{opt.label}: help [default: {prose}], default {opt.param.default!r}")
        except Exception:
            wrong.append(f"{opt.label}: help [default: {prose}] is prose, default is a value")
    assert not wrong, wrong


def _option(cli, command: str, name: str) -> click.Option:
    options, _ = cli
    return next(o.param for o in options[name] if o.command == command)


def test_model_uri_help_names_every_kind_of_model(cli) -> None:
    """docs/node.md's table of model URIs is what `--model-uri`'s help names."""
    help_text = " ".join((_option(cli, "job submit", "--model-uri").help or "").split())
    table = (ROOT / "docs" / "node.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (.+?) \| .+\|$", table.split("| model URI |", 1)[1], re.M)
    kinds = []
    for row in rows:
        if not row.startswith(("`", "a local folder")):
            break
        kinds += [
            re.split(r"[:/]", uri)[0] + ":" for uri in re.findall(r"`([a-z0-9]+:[^`]*)`", row)
        ]
        if "folder" in row:
            kinds.append("folder")
    assert {"builtin:", "hf:", "p2p:", "https:", "folder"} <= set(kinds)
    missing = [k for k in kinds if k.rstrip(":") not in help_text]
    assert not missing, (missing, help_text)


def test_x402_price_is_read_in_whole_tokens_as_help_says(cli) -> None:
    unit = sdk_cli._TokenUnit("0x" + "11" * 20, 6, "TestUSD")
    assert sdk_cli._price("0.01", unit) == 10_000  # whole tokens, 6 decimals
    for name in ("--x402", "--price"):
        text = " ".join((_option(cli, "job submit", name).help or "").split())
        assert "base units" not in text, (name, text)
        assert "whole tokens" in text, (name, text)


def test_round_deadline_default_is_the_documented_one(cli) -> None:
    param = _option(cli, "node run", "--round-deadline")
    pairs, _ = collect(cli)
    documented = [st for st, opt in pairs if isinstance(opt, CliOption) and opt.param is param]
    assert documented, "docs/protocol.md states --round-deadline's default"
    assert all(agrees(opt, st.value) is None for st, opt in pairs if st in documented)


class _Deployed(BaseException):
    """Stops `dtrain deploy` at the deployment, with the Params it would send."""


def test_deploy_defaults_are_the_params_defaults(monkeypatch) -> None:
    """docs/sdk.md: `dtrain deploy`'s option defaults are the `Params` defaults."""
    from dtrain.models import Params

    def deploy(url, account, params):
        raise _Deployed(params)

    monkeypatch.setattr(sdk_cli.BSM, "deploy", staticmethod(deploy))
    key = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
    with pytest.raises(_Deployed) as got:
        sdk_cli.main(["--rpc-url", "http://127.0.0.1:1", "--key", key, "deploy"])
    sent = got.value.args[0]
    assert sent == Params(treasury=sent.treasury, developer=sent.developer)
    text = (ROOT / "docs" / "sdk.md").read_text(encoding="utf-8")
    assert re.search(r"its defaults are\s+the `Params` defaults", text)
