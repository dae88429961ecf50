"""`quickdraft bench --edits`: next-edit cases replayed through the real language server, as an
editor asks for next edits. The cases are the rules bench's (edits_cases.py: mined as the
literature mines them from each comma-separated history, one-hunk files kept as cases whose
right answer is no edit), so both benches score the same cases the same way.

For every strategy (`ar` first: the baseline) one `quickdraft serve` runs as a subprocess with
the bench's model flags and `decoding.strategy` set (typing_server.py starts and initializes it
as VS Code does). Every pair then goes the same way on every server:

1. `didOpen` the file as it was before the commit;
2. with `--edits-arrival on` (the default) the cursor arrives where the edit will start and
   rests there: `textDocument/copilotInlineEdit` is asked there, before the edit, as the editors
   ask when a cursor rests (quickdraft's VS Code extension after 600 ms, Copilot's NES, Cursor
   Tab), and its answer awaited (the person reads the code before typing) and recorded as the
   arrival, not scored: it is what leaves the edit prompt's head in the server's cache, as it
   would be in an editor; `off` measures a cold server instead;
3. `didChange` with the commit's first hunk as one incremental change (range and text), so the
   server's edit history sees the user's edit;
4. after `--edits-rest-ms` (default REST_MS, Neovim's rest; VS Code's is 600 ms: both editors
   ask only once the person has stopped typing and rests), `textDocument/copilotInlineEdit`
   with `{textDocument: {uri, version}, position}` at the end of the edit's new text, awaited
   and timed from when it is sent; `textDocument/didShowInlineEdit` for the first edit shown;
5. the `$/quickdraft/stats` the server sends for the request (matched by `requestId`);
6. `didClose`.

The answer's edits are applied to the editor's copy of the document: each must name the
document and the version asked, lie inside it, and not overlap another; any that does not makes
the run an error. The result is scored against the truth, the file as the commit left it
(edits_cases.score), and summarized per strategy both as a speed comparison and per rule as the
rules bench does (coverage, precision, harm, exact with Wilson intervals; edits_report.py).
results.json is rewritten after every pair, so an interrupt keeps what was measured; report.md
at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from quickdraft.bench import edits_cases, edits_report
from quickdraft.bench.editor import EditorDocument
from quickdraft.bench.edits import DEFAULT_SINCE, EditPair, git_dir, head_commit
from quickdraft.bench.edits_importers import run_importers_bench
from quickdraft.bench.edits_rules_cli import history_name, mine_histories, run_rules_bench
from quickdraft.bench.edits_signatures import run_signatures_bench
from quickdraft.bench.lsp_client import METHOD_NOT_FOUND, Answer
from quickdraft.bench.provenance import peak_memory, provenance
from quickdraft.bench.typing_cli import base_settings, model_flags, parse_names
from quickdraft.bench.typing_replay import merge_settings
from quickdraft.bench.typing_server import TypingServer, run_and_write_results
from quickdraft.config import STRATEGIES
from quickdraft.errors import ConfigError, LanguageServerError, QuickdraftError
from quickdraft.lsp.documents import UTF16, Document
from quickdraft.models.store import write_json_atomic

PREFIX = "quickdraft bench --edits"
INLINE_EDIT = "textDocument/copilotInlineEdit"
DID_SHOW = "textDocument/didShowInlineEdit"
DEFAULT_STRATEGIES = "ar,ngram,hybrid"
DEFAULT_CASES = 12
"""Cases per history."""
QUICK_PAIRS = 3
REST_MS = 500
"""How long after the edit the next edit is asked for: the shorter rest of quickdraft's two
editor clients (Neovim's `next_edit.debounce_ms` after leaving insert mode; VS Code's
`quickdraft.nextEdit.debounceMs`, 600, after the cursor moves)."""
STATS_WAIT_S = 5.0
"""How long the stats notification of an answered request is waited for."""
WARMUP_TEXT = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"
WARMUP_EDIT = (len("def area(width"), len("def area(width"), "_cm")
"""The untimed first next edit: a parameter renamed, so the server loads its edit prompt."""


class EditError(QuickdraftError):
    """An answer's edits cannot be applied to the document they were asked for."""


def apply_edits(text: str, uri: str, version: int, edits: Any) -> str:
    """`text` with the answer's `edits` applied (all ranges are in `text`, UTF-16); EditError
    when one names another document or version, lies outside the text or overlaps another."""
    if not isinstance(edits, list):
        raise EditError(f"edits is not a list: {edits!r:.80}")
    document = Document(uri, text, "plaintext", version, UTF16)
    spans: list[tuple[int, int, str]] = []
    for number, edit in enumerate(edits, 1):
        if not isinstance(edit, dict) or not isinstance(edit.get("text"), str):
            raise EditError(f"edit {number} has no text: {edit!r:.80}")
        named = edit.get("textDocument") or {}
        if named.get("uri") != uri:
            raise EditError(f"edit {number} is for {named.get('uri')}, asked for {uri}")
        if named.get("version") != version:
            raise EditError(
                f"edit {number} is for version {named.get('version')}, asked for version {version}"
            )
        try:
            start, end = (
                document.offset_at(edit["range"][side]["line"], edit["range"][side]["character"])
                for side in ("start", "end")
            )
        except (KeyError, TypeError) as exc:
            raise EditError(f"edit {number} has no valid range ({exc!r})") from None
        except QuickdraftError as exc:
            raise EditError(f"edit {number}'s range is outside the document: {exc}") from None
        if end < start:
            raise EditError(f"edit {number}'s range ends before it starts")
        spans.append((start, end, edit["text"]))
    spans.sort(key=lambda span: (span[0], span[1]))
    for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise EditError("edits overlap")
    for start, end, new in reversed(spans):
        text = text[:start] + new + text[end:]
    return text


@dataclass
class EditsOptions:
    out: Path
    strategies: list[str]
    server_command: list[str]
    """`python -m quickdraft.cli serve` and the model flags, without settings."""
    settings: dict[str, Any]
    """The settings tree every strategy's server starts from."""
    since: str = DEFAULT_SINCE
    seed: int = 0
    request_timeout_s: float = 600.0
    load_timeout_s: float = 1800.0
    stats_wait_s: float = STATS_WAIT_S
    arrival: bool = True
    """Ask for a next edit where the cursor arrives, before the edit (the module's step 2)."""
    rest_ms: float = REST_MS
    """The rest between the edit and the request (the module's step 4)."""


class EditsBench:
    """Every strategy's server, and on it every pair."""

    def __init__(
        self, pairs: list[EditPair], options: EditsOptions, *, heads: dict[str, str | None]
    ):
        self.pairs = pairs
        self.options = options
        self.out = options.out
        repositories = list(dict.fromkeys(pair.repository for pair in pairs))
        # One workspace folder, named after the first history: a case's file lies at its own
        # path in it, as in its repository (cases are opened and closed one at a time).
        name = history_name(Path(repositories[0])) if repositories else "repo"
        self.root = self.out / "workspace" / name
        self.env: dict[str, Any] = {
            **provenance(),
            "repositories": repositories,
            "heads": heads,
            "since": options.since,
            "seed": options.seed,
            "arrival": options.arrival,
            "rest_ms": options.rest_ms,
            "pairs": [pair.to_dict() for pair in pairs],
            "strategies": options.strategies,
            "server_command": options.server_command,
            "settings": options.settings,
            "root": str(self.root),
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "interrupted": False,
        }
        self.strategies: dict[str, dict[str, Any]] = {}
        self.server: TypingServer | None = None

    def say(self, message: str) -> None:
        print(f"{PREFIX}: {message}" if not message.startswith(" ") else message, file=sys.stderr)

    def results(self) -> dict[str, Any]:
        results = {"env": self.env, "strategies": self.strategies}
        results["summary"] = edits_report.summarize(results)
        return results

    def write(self, *, final: bool) -> dict[str, Any]:
        self.env.update(peak_memory())
        if final:
            self.env["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        results = self.results()
        write_json_atomic(self.out / "results.json", results)
        if final:
            (self.out / "report.md").write_text(
                edits_report.render_markdown(results), encoding="utf-8"
            )
        return results

    def run(self) -> dict[str, Any]:
        self.root.mkdir(parents=True, exist_ok=True)
        return run_and_write_results(self, self._run_all())

    async def _run_all(self) -> None:
        for number, strategy in enumerate(self.options.strategies, 1):
            await self._run_strategy(number, strategy)

    async def _run_strategy(self, number: int, strategy: str) -> None:
        options = self.options
        settings = merge_settings(options.settings, {"decoding": {"strategy": strategy}})
        record: dict[str, Any] = {"settings": settings, "server": {}, "error": None, "runs": []}
        self.strategies[strategy] = record
        log_path = self.out / "logs" / f"serve-{number}-{strategy}.log"
        self.say(
            f"strategy {number}/{len(options.strategies)} {strategy}: starting quickdraft serve "
            f"(log: {log_path})"
        )
        command = [*options.server_command, "--log-level", "info"]
        server = TypingServer(command, settings, log_path, self.say, root=self.root)
        self.server = server
        started = time.perf_counter()
        try:
            record["server"]["warmup_s"] = await server.start_and_warm_up(options.load_timeout_s)
            await self._warm_up_edits(server)
            models = server.models or {}
            record["server"].update(
                models=models,
                runtime=models.get("runtime"),
                dtype=models.get("dtype"),
                device=models.get("device"),
            )
            self.say(f"  ready after {time.perf_counter() - started:.1f} s")
            for index, pair in enumerate(self.pairs):
                run = await self._run_pair(server, index, pair)
                record["runs"].append(run)
                self.say(
                    f"  case {index + 1}/{len(self.pairs)} {pair.name}: "
                    + edits_report.pair_line(run)
                )
                self.write(final=False)
        except LanguageServerError as exc:
            record["error"] = str(exc)
            self.say(f"  strategy {strategy} stopped: {exc}")
        finally:
            await server.close_and_note(record["server"])
            self.server = None
            self.write(final=False)

    async def _warm_up_edits(self, server: TypingServer) -> None:
        """One untimed next edit; a server that does not know the request stops here."""
        client = server.client
        doc = EditorDocument((self.root / "quickdraft-warmup.py").as_uri(), "python", WARMUP_TEXT)
        client.notify("textDocument/didOpen", doc.did_open())
        start, end, text = WARMUP_EDIT
        client.notify("textDocument/didChange", doc.edit(start, end, text))
        request = client.request(INLINE_EDIT, inline_edit_params(doc, start + len(text)))
        answer = await client.wait(request, self.options.load_timeout_s, what="the warm-up edit")
        client.notify("textDocument/didClose", {"textDocument": {"uri": doc.uri}})
        if answer.error and answer.error.get("code") == METHOD_NOT_FOUND:
            raise LanguageServerError(
                f"the server does not implement {INLINE_EDIT}: {answer.error.get('message')}"
            )

    async def _run_pair(self, server: TypingServer, index: int, pair: EditPair) -> dict[str, Any]:
        client = server.client
        uri = (self.root / pair.path).as_uri()
        doc = EditorDocument(uri, pair.language, pair.before)
        client.notify("textDocument/didOpen", doc.did_open())
        run: dict[str, Any] = {"pair": index, "kind": edits_cases.kind(pair)}
        try:
            if self.options.arrival:
                await self._arrive(server, index, doc, pair.edit_start, run)
            client.notify(
                "textDocument/didChange", doc.edit(pair.edit_start, pair.edit_end, pair.edit_text)
            )
            assert doc.text == pair.current
            version = doc.document.version
            if self.options.rest_ms:
                await asyncio.sleep(self.options.rest_ms / 1000)
            request = client.request(INLINE_EDIT, inline_edit_params(doc, pair.cursor))
            run.update(id=request.id, version=version, position=doc.position(pair.cursor))
            answer = await client.wait(
                request,
                self.options.request_timeout_s,
                what=f"the next edit for case {index + 1}",
                heartbeat=lambda waited: self.say(f"    waiting for the answer ({waited:.0f} s)…"),
            )
            run["latency_ms"] = round((answer.received - request.sent) * 1000, 3)
            self._read_answer(answer, pair, uri, version, run)
            if run["edits"] and run["error"] is None:
                client.notify(DID_SHOW, {"item": answer.result["edits"][0]})
        finally:
            if not client.exited:
                client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        if not answer.error:
            await self._read_stats(server, request.id, run)
        return run

    async def _arrive(
        self, server: TypingServer, index: int, doc: EditorDocument, offset: int, run: dict
    ) -> None:
        """The request where the cursor arrives before the edit: awaited, timed, not scored."""
        client = server.client
        request = client.request(INLINE_EDIT, inline_edit_params(doc, offset))
        answer = await client.wait(
            request,
            self.options.request_timeout_s,
            what=f"the next edit where the cursor arrived for case {index + 1}",
            heartbeat=lambda waited: self.say(f"    waiting at the arrival ({waited:.0f} s)…"),
        )
        result = answer.result if isinstance(answer.result, dict) else {}
        run["arrival"] = {
            "latency_ms": round((answer.received - request.sent) * 1000, 3),
            "error": (answer.error or {}).get("message"),
            "edits": len(result.get("edits") or []),
        }

    @staticmethod
    def _read_answer(
        answer: Answer, pair: EditPair, uri: str, version: int, run: dict[str, Any]
    ) -> None:
        """The answer's edits, applied to the document asked about and scored (or the error)."""
        if answer.error:
            run.update(edits=None, error=f"error answer: {answer.error.get('message')}")
            return
        result = answer.result
        edits = result.get("edits") if isinstance(result, dict) else None
        try:
            if edits is None:
                raise EditError(f"the answer has no edits: {result!r:.80}")
            applied = apply_edits(pair.current, uri, version, edits)
        except EditError as exc:
            run.update(edits=edits if isinstance(edits, list) else None, error=str(exc))
            return
        run["edits"] = [{"range": e["range"], "text": e["text"]} for e in edits]
        run["error"] = None
        run["proposed"] = bool(edits)
        run.update(edits_cases.score(pair.current, pair.truth, applied))

    async def _read_stats(self, server: TypingServer, request_id: int, run: dict[str, Any]) -> None:
        deadline = time.perf_counter() + self.options.stats_wait_s
        while request_id not in server.stats and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        stats = server.stats.get(request_id)
        run["stats"] = stats is not None
        if stats is None:
            return
        run.update(
            server_ms=stats.get("latencyMs"),
            tokens=stats.get("tokens"),
            target_forwards=stats.get("targetForwards"),
            tokens_per_forward=stats.get("tokensPerForward"),
            copied_tokens=stats.get("copiedTokens"),
            stats_edit_count=stats.get("editCount"),
            feature=stats.get("feature"),
            prompt_tokens=stats.get("promptTokens"),
            prefill_tokens=stats.get("prefillTokens"),
            accepted_by_source=stats.get("acceptedBySource"),
            drafted_by_source=stats.get("draftedBySource"),
            engine=stats.get("engine"),
            rule=stats.get("rule"),
            confidence=stats.get("confidence"),
            vetoed=stats.get("vetoed"),
            judged=stats.get("judged"),
            decided_ahead=stats.get("decidedAhead"),
            stages_ms=stats.get("stagesMs"),
        )


def rest_ms(value: float) -> float:
    """`--edits-rest-ms`, checked."""
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"--edits-rest-ms: must be milliseconds, 0 or more, got {value}")
    return value


def inline_edit_params(doc: EditorDocument, offset: int) -> dict[str, Any]:
    """`textDocument/copilotInlineEdit` as the Copilot client sends it."""
    return {
        "textDocument": {"uri": doc.uri, "version": doc.document.version},
        "position": doc.position(offset),
    }


# --- the command line -----------------------------------------------------------------------


def add_edits_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "edits",
        "with --edits: next-edit suggestions (textDocument/copilotInlineEdit) through `quickdraft"
        " serve`, on cases mined from git histories as --edits-rules mines them (--strategies: "
        f"default {DEFAULT_STRATEGIES}; ar is always run)",
    )
    group.add_argument(
        "--edits", action="store_true", help="the next-edit benchmark: a server per strategy"
    )
    group.add_argument(
        "--edits-repo",
        type=Path,
        metavar="PATH",
        help="the repositories whose histories give the cases, comma-separated: each a checkout "
        "or a (bare) git directory (default: --repo)",
    )
    group.add_argument(
        "--edits-since",
        default=DEFAULT_SINCE,
        metavar="DATE",
        help=f"only commits since DATE (git log --since; default {DEFAULT_SINCE})",
    )
    group.add_argument(
        "--edits-max-pairs",
        type=int,
        metavar="N",
        help=f"cases to mine per history (default {DEFAULT_CASES}; {QUICK_PAIRS} with --quick; "
        "--edits-rules: 60); --seed picks which when there are more",
    )
    group.add_argument(
        "--edits-list",
        action="store_true",
        help="print the cases mined (one line each) and stop: no server, no model",
    )
    group.add_argument(
        "--edits-arrival",
        choices=("on", "off"),
        default="on",
        help="on (default): ask for a next edit where the cursor arrives, before the edit, as "
        "editors do when the cursor rests, so the timed request finds the server as an editor "
        "leaves it; off: the timed request is the pair's first (a cold server)",
    )
    group.add_argument(
        "--edits-rest-ms",
        type=float,
        default=REST_MS,
        help=f"milliseconds between the edit and the request for the next edit (default "
        f"{REST_MS}: editors ask once the person rests; 0: at once)",
    )
    group.add_argument(
        "--edits-rules",
        action="store_true",
        help="the rules' own benchmark (no model, no server): cases mined from each of the "
        "comma-separated --edits-repo histories (commits changing at most 3 source files, 1-6 "
        "close hunks per file; one-hunk files are no-edit cases), the rules and vetoes run as "
        "the server runs them, scored per rule with 95%% Wilson intervals",
    )
    group.add_argument(
        "--edits-importers",
        action="store_true",
        help="the rules across files (no model, no server): in commits changing 2-3 Python "
        "files, each pair where one imports the other; the other's hunks typed one at a time, "
        "a next edit asked in the importing file, scored against the commit's",
    )
    group.add_argument(
        "--edits-signatures",
        action="store_true",
        help="an added parameter's argument (loads the model): every commit of the "
        "--edits-repo histories in which a function gained a parameter without a default and "
        "its calls in the file an argument; the header typed, the next edit asked as the "
        "server asks it, compared with the commit's argument at that call",
    )
    group.add_argument(
        "--edits-veto",
        action="store_true",
        help="with --edits-rules: load the model (the bench's model flags and --config) and "
        "run the likelihood veto as the server does (edits.likelihood_veto); without it, the "
        "rules' vetoes only, no model",
    )
    group.add_argument(
        "--edits-timeout-s",
        type=float,
        default=600.0,
        help="longest wait for one next edit before the server counts as stuck (default 600)",
    )


def parse_edit_strategies(value: str | None) -> list[str]:
    names = parse_names(value, DEFAULT_STRATEGIES, STRATEGIES, "--strategies")
    return ["ar", *[name for name in names if name != "ar"]]


def pair_summary(pair: EditPair) -> str:
    """One line about a case: commit, date, file, hunks, and the user's edit."""
    removed = pair.before[pair.edit_start : pair.edit_end]
    hunks = (
        f"{pair.hunks} hunks, the next {pair.next_lines} lines down"
        if pair.hunks > 1
        else "1 hunk: no edit is right"
    )
    return (
        f"{pair.commit[:10]} {pair.date[:10]} {pair.path} ({hunks}): "
        f"{removed!r:.40} -> {pair.edit_text!r:.40}"
    )


def serve_command(flags: list[str]) -> list[str]:
    """The server every strategy runs: this Python's `quickdraft serve` with the model flags."""
    return [sys.executable, "-m", "quickdraft.cli", "serve", *flags]


def run_edits(args: argparse.Namespace) -> int:
    """`quickdraft bench --edits ...`: returns the exit status."""
    if args.typing:
        raise ConfigError("--edits: not with --typing (each is its own benchmark)")
    if args.sweep_draft_length:
        raise ConfigError("--sweep-draft-length: not with --edits")
    repo = args.edits_repo or args.repo
    if repo is None:
        raise ConfigError("--edits-repo: required with --edits (or give --repo)")
    if sum(map(bool, (args.edits_rules, args.edits_importers, args.edits_signatures))) > 1:
        raise ConfigError(
            "--edits-rules, --edits-importers, --edits-signatures: one at a time (each is its "
            "own benchmark)"
        )
    if args.edits_signatures:
        return run_signatures_bench(args, str(repo))
    if args.edits_rules:
        return run_rules_bench(args, str(repo))
    if args.edits_importers:
        return run_importers_bench(args, str(repo))
    if args.edits_veto:
        raise ConfigError("--edits-veto: only with --edits-rules (the server runs it otherwise)")
    wanted = args.edits_max_pairs or (QUICK_PAIRS if args.quick else DEFAULT_CASES)
    strategies = parse_edit_strategies(args.strategies)
    settings = base_settings(args, max_tokens_section="edits")
    histories = [Path(part) for part in str(repo).split(",") if part]
    pairs = mine_histories(histories, args.edits_since, wanted, args.seed, say=print_stderr)
    heads = {str(Path(h).expanduser().resolve()): head_commit(git_dir(Path(h))) for h in histories}
    if args.edits_list:
        for history in dict.fromkeys(pair.repository for pair in pairs):
            mined = [pair for pair in pairs if pair.repository == history]
            print(f"{len(mined)} cases from {history} (commits since {args.edits_since}):")
            for pair in mined:
                print(pair_summary(pair))
        return 0
    flags = model_flags(args)
    if args.quick and "--no-calibrate" not in flags:
        flags.append("--no-calibrate")
    out = args.out or Path("bench-out") / datetime.now().strftime("edits-%Y%m%d-%H%M%S")
    options = EditsOptions(
        out=Path(out),
        strategies=strategies,
        server_command=serve_command(flags),
        settings=settings,
        since=args.edits_since,
        seed=args.seed,
        request_timeout_s=args.edits_timeout_s,
        arrival=args.edits_arrival == "on",
        rest_ms=rest_ms(args.edits_rest_ms),
    )
    bench = EditsBench(pairs, options, heads=heads)
    bench.say(
        f"{len(pairs)} cases from {', '.join(history_name(h) for h in histories)} (commits "
        f"since {args.edits_since}), strategies {', '.join(strategies)}"
    )
    try:
        results = bench.run()
    except KeyboardInterrupt:
        bench.say(f"interrupted; what was measured is in {options.out}")
        raise
    print(edits_report.summary_table(results))
    for name, summary in results["summary"].items():
        if summary.get("cases"):
            print(f"\n{name}, scored per rule:\n")
            print("\n".join(edits_report.cases_table(summary)))
    print(f"\nresults: {options.out / 'results.json'}  report: {options.out / 'report.md'}")
    failed = edits_report.failures(results)
    for line in failed:
        print(f"{PREFIX}: {line}", file=sys.stderr)
    return 1 if failed else 0


def print_stderr(message: str) -> None:
    print(f"{PREFIX}: {message}", file=sys.stderr)
