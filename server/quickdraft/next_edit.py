"""The next-edit pipeline (`textDocument/copilotInlineEdit`), beside the completion pipeline:

    request -> the latest edit -> rule candidates (context.edit_rules) -> vetoes
            (context.edit_vetoes) -> the first survivor, one edit; none: abstain, or, for a
            model trained for next edits (`edits.model_rewrite`), the model's rewrite:
    request -> region (context.edit_prompt) -> prompt (recent edits, other files, the region)
            -> tokenize -> generate (the backend, copy drafting from the region)
            -> the region as rewritten -> diff against the region as it is -> minimal edits

The rules' part reads no cursor (`decide_rules`), so the server decides it ahead, after each
change, and the request for that version takes it (lsp/work_ahead.py). An answer of no edit at
a cursor resting away from the latest edit computes the veto's window head for an edit there
(`warm_window_head`), as a person rests before editing.

Plain functions over `EditSources`, this pipeline's own dependencies (the backend, the prompt
tokenizer, the open documents and their workspace head, the root, the settings): it shares
them with the completion pipeline but never calls it, and nothing here knows LSP. Offsets are
code points into the request's text. Both pipelines generate by `generation.generate_step`,
and each answer says what every stage took (`NextEdit.stages`).

The answer is judged before it is shown (`reject_reason`): a rewrite that did not finish the
region (it hit `max_new_tokens` or the deadline mid-region) gives no edit, and neither does
one that replaces more than REWRITE_SHARE of the region's characters (at least REWRITE_FLOOR
of them): a next edit changes a few spots, and a model that rewrote most of the region
wandered off (or deleted it). A rewrite larger than GROWTH_LIMIT times the region (plus
GROWTH_SLACK characters) is refused for the same reason.

Threads: run on the thread that owns the backend (the language server's model worker).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from quickdraft.admission import refusal
from quickdraft.config import QuickdraftConfig
from quickdraft.context import OpenDocument, Prompt
from quickdraft.context.edit_history import Hunk, lines_with_breaks
from quickdraft.context.edit_importers import importer_candidates
from quickdraft.context.edit_prompt import (
    ContextFile,
    EditableRegion,
    EditContext,
    choose_format,
    choose_region,
    display_path,
    overrun_start,
    render_edit_prompt,
)
from quickdraft.context.edit_proposals import propose
from quickdraft.context.edit_rules import (
    ARGUMENT_MAX_CHARS,
    FLOOR,
    Candidate,
    LatestEdit,
    argument_written,
    latest_edit,
)
from quickdraft.context.edit_vetoes import (
    FILL_LOGPROB,
    FILL_TOKENS,
    NEAR_GAIN,
    WINDOW_TOKENS,
    Decision,
    Filler,
    Judge,
    LikelihoodWindow,
    clearly_likely,
    fill_window,
    likelihood_window,
    likely_enough,
    vet,
    vet_importer,
    window_head,
)
from quickdraft.context.prompt import TokenCounter, prompt_tokens
from quickdraft.context.workspace import WorkspaceHead
from quickdraft.decoding import GenerationStats
from quickdraft.decoding.runner import common_prefix_length
from quickdraft.generation import (
    EDIT_SLOT,
    Backend,
    Generated,
    NextEditRequest,
    PreparedEdit,
    StageClock,
    cursor_offset,
    generate_step,
    stages_of,
)
from quickdraft.text import without_lone_surrogates
from quickdraft.tokens import PromptTokenizer

REWRITE_SHARE = 0.5
REWRITE_FLOOR = 80
GROWTH_LIMIT = 4
GROWTH_SLACK = 200
ANSWER_TOKENS_SLACK = 64
"""A rewrite gets at most twice the region's tokens plus this many (within
`edits.max_new_tokens`): enough for any next edit, not for a runaway."""
HEAD_SLOT = "#edit-head"
"""Suffix of the cache slot where a resting cursor's window head is computed
(`warm_window_head`): the veto's own slot (EDIT_SLOT) holds one window at a time, and a full
window adopts the head from here."""


@dataclass(frozen=True)
class EditSources:
    """What the next-edit pipeline reads, handed in per request (the language server's worker
    builds it from what it holds: `backends.edit_sources`)."""

    backend: Backend
    prompts: PromptTokenizer
    config: QuickdraftConfig
    """The settings as the backend honours them."""
    documents: Mapping[str, OpenDocument]
    """The open documents (the rules look for other uses of a name in them)."""
    head: WorkspaceHead
    """The open documents' first chunks (the prompt shows the other files by them)."""
    root: str | None
    """The workspace folder paths are shown relative to."""
    count_tokens: TokenCounter
    """Token counts of texts, cached (the completion pipeline's counter: the same texts)."""
    model_names: Sequence[str]
    """The names the model is known by (`Models.names`): the prompt format is chosen by them."""


@dataclass(frozen=True)
class Edit:
    """Replace `start`..`end` (code points into the request's text) with `text`."""

    start: int
    end: int
    text: str


@dataclass
class NextEdit:
    edits: list[Edit] = field(default_factory=list)
    """The smallest edits that turn the region into the rewrite, top to bottom."""
    region: EditableRegion | None = None
    format: str = ""
    rewritten: str | None = None
    """The region as the model wrote it (None: it did not finish it)."""
    raw_text: str = ""
    tokens: list[int] = field(default_factory=list)
    stop_reason: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)
    prompt_tokens: int = 0
    latency_ms: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    """Milliseconds per stage: context_ms (region, history, prompt), tokenize_ms,
    prefill_ms, decode_ms, diff_ms."""
    rejected: str | None = None
    """Why the rewrite gave no edit although it differs from the region (reject_reason)."""
    skipped: str | None = None
    """Why no rewrite was attempted (next edits disabled, document unusable)."""
    mode: str = "edit"
    rule: str | None = None
    """The rule whose candidate is shown (rename, import, signature, repeat); None: the model's
    rewrite, or no edit."""
    confidence: float | None = None
    candidates: int = 0
    """Rule candidates the latest edit gave (before the vetoes)."""
    vetoed: dict[str, int] = field(default_factory=dict)
    """Veto -> rule candidates it removed (context.edit_vetoes)."""
    judged: int = 0
    """Rule candidates the model scored for the likelihood veto (a backend that cannot score
    scores none)."""
    filled: int = 0
    """Rule candidates the model was asked to write an argument for (`argument_filler`)."""
    abstained: str | None = None
    """Why no edit was proposed when nothing was wrong (no candidate survived, and the model's
    rewrite is off for this model)."""
    ahead: bool = False
    """The rules' decision was made before the request came (the server decides after each
    change, while the worker is idle: `decide_rules`)."""
    head_tokens: int = 0
    """Tokens of a window head computed for an edit that may start at the cursor
    (`warm_window_head`)."""

    @property
    def copied_tokens(self) -> int:
        """Output tokens that came from accepted copy drafts (the region as it stood)."""
        return int((self.stats.accepted_by_source or {}).get("copy", 0))


# --- the answer -------------------------------------------------------------------------


def minimal_edits(old: str, new: str, base: int = 0) -> list[Edit]:
    """The edits turning `old` into `new`: a line-level diff (difflib), each changed run of
    lines trimmed to the characters that differ at both of its ends; offsets are into `old`
    plus `base`. None when the texts are equal."""
    if old == new:
        return []
    a, b = lines_with_breaks(old), lines_with_breaks(new)
    starts = [0]
    for line in a:
        starts.append(starts[-1] + len(line))
    edits = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        removed, added = "".join(a[i1:i2]), "".join(b[j1:j2])
        head = 0
        while head < min(len(removed), len(added)) and removed[head] == added[head]:
            head += 1
        tail = 0
        while (
            tail < min(len(removed), len(added)) - head
            and removed[len(removed) - 1 - tail] == added[len(added) - 1 - tail]
        ):
            tail += 1
        start = base + starts[i1] + head
        edits.append(Edit(start, base + starts[i2] - tail, added[head : len(added) - tail]))
    return edits


def _same_lines(a: Sequence[str], b: Sequence[str]) -> bool:
    return [line.rstrip() for line in a] == [line.rstrip() for line in b]


def without_overrun(region: EditableRegion, rewritten: str) -> str:
    """`rewritten` without what the model wrote past the region: lines that repeat the start
    of the text after it (it read them in the prompt and wrote on), or the end of the text
    before it. Small models do this; kept, it inserts a second copy of the file's next lines.
    Lines the region itself ends (or starts) with are never taken for an overrun."""
    new, old = lines_with_breaks(rewritten), lines_with_breaks(region.text)
    after, before = lines_with_breaks(region.after), lines_with_breaks(region.before)
    # Where the rewrite starts to repeat the lines after the region (two lines, or what there
    # is), and the region itself has something else there: the rest is the model writing on
    # (it may go past what it was shown, making lines up).
    run = min(2, len(after))
    for j in range(1, len(new) - run + 1) if run else ():
        if (
            any(line.strip() for line in new[j : j + run])
            and _same_lines(new[j : j + run], after[:run])
            and not _same_lines(old[j : j + run], new[j : j + run])
        ):
            new = new[:j]
            break
    for k in range(min(len(new) - 1, len(before)), 0, -1):
        head = new[:k]
        if (
            any(line.strip() for line in head)
            and _same_lines(head, before[-k:])
            and not _same_lines(old[:k], head)
        ):
            new = new[k:]
            break
    # The region's own ending (its last line has no break: the next line's start follows) is
    # the rewrite's too: blank lines a model leaves at the end are no edit anyone wants.
    ending = region.text[len(region.text.rstrip("\r\n")) :]
    return "".join(new).rstrip("\r\n") + ending


def reject_reason(region: str, rewritten: str | None, edits: Sequence[Edit]) -> str | None:
    """Why a rewrite of `region` must give no edit, or None (see the module's rule)."""
    if rewritten is None:
        return "the rewrite did not finish the region"
    replaced = sum(edit.end - edit.start for edit in edits)
    if replaced > max(REWRITE_SHARE * len(region), REWRITE_FLOOR):
        return f"the rewrite replaced {replaced} of the region's {len(region)} characters"
    if len(rewritten) > GROWTH_LIMIT * len(region) + GROWTH_SLACK:
        return f"the rewrite grew the region from {len(region)} to {len(rewritten)} characters"
    return None


# --- the pipeline -----------------------------------------------------------------------


def skip_reason(sources: EditSources, request: NextEditRequest) -> str | None:
    """None if the request should go to the model, else the reason not to (the one gate,
    `admission.refusal`)."""
    refused = refusal(sources.config, "edit", request.language_id, request.text)
    return None if refused is None else refused.reason


def edit_format(sources: EditSources) -> str:
    """`edits.format`, with `auto` resolved by the model's names."""
    return choose_format(sources.config.edits.format, sources.model_names)


def model_rewrites(sources: EditSources) -> bool:
    """Whether the model rewrites the region when no rule proposes (`edits.model_rewrite`;
    `auto`: only a model trained for next edits, named by its format)."""
    setting = sources.config.edits.model_rewrite
    if setting != "auto":
        return setting == "on"
    return edit_format(sources) != "instruct"


def rule_decision(
    sources: EditSources,
    request: NextEditRequest,
    *,
    cancel: threading.Event | None = None,
    floor: float = FLOOR,
    clock: StageClock | None = None,
) -> Decision:
    """The rules' candidates for the request's latest edit, vetoed, the likelihood veto asked
    of the backend where `edits.likelihood_veto` is on, an added parameter's argument written
    by it where `edits.fill_arguments` is (edits.rules off: none). `clock`: the rules' time is
    lapped as `rules_ms`, the model's as `veto_ms` (`fill_ms` for the argument)."""
    if not sources.config.edits.rules:
        return Decision()
    clock = clock or StageClock()
    judge = likelihood_judge(sources, request, cancel, clock)
    filler = argument_filler(sources, request, cancel, clock)

    def cancelled() -> bool:
        return cancel is not None and cancel.is_set()

    def own() -> Decision:
        return decide(
            request.uri,
            request.text,
            request.hunks,
            request.language_id,
            floor=floor,
            judge=judge,
            filler=filler,
            cancelled=cancelled,
        )

    def importer() -> Decision:
        return decide_importer(request, sources.documents, floor=floor)

    # The latest edit first: this document's own, or the other document's edited since.
    first, then = (importer, own) if request.edited_elsewhere_since else (own, importer)
    decision = first()
    if decision.shown is not None or cancelled():
        return decision
    return decision.then(then())


def decide_importer(
    request: NextEditRequest, documents: Mapping[str, OpenDocument], *, floor: float = FLOOR
) -> Decision:
    """The candidates in the request's document that the latest edit of the other document
    edited last calls for when this one imports what it changed (context/edit_importers.py),
    vetoed."""
    if not request.other_hunks:
        return Decision()
    source = request.other_hunks[-1].uri
    document = documents.get(source)
    if document is None or document.language_id != request.language_id:
        return Decision()
    hunks = [h for h in request.other_hunks if h.uri == source]
    edit = latest_edit(source, document.text, hunks, document.language_id)
    if edit is None:
        return Decision()
    candidates = importer_candidates(edit, request.uri, request.text)
    return vet_importer(request.text, edit.grammar, candidates, floor=floor)


@dataclass(frozen=True)
class DecidedEdit:
    """The rules' decision for one version of a document and what it took (`rules_ms`,
    `veto_ms`), made for a request or ahead of it."""

    decision: Decision
    stages: dict[str, float]
    ahead: bool = False


def decide_rules(
    sources: EditSources,
    request: NextEditRequest,
    *,
    cancel: threading.Event | None = None,
    ahead: bool = False,
) -> DecidedEdit | None:
    """`rule_decision`, timed; None when `cancel` stopped it (a decision cut short must never
    pass for "no edit"). It reads no cursor: made `ahead` after a change, it answers any
    request for that version of the document."""
    clock = StageClock()
    decision = rule_decision(sources, request, cancel=cancel, clock=clock)
    clock.lap("rules_ms")
    if cancel is not None and cancel.is_set():
        return None
    stages = {k: v for k, v in clock.stages.items() if k in ("rules_ms", "veto_ms", "fill_ms")}
    return DecidedEdit(decision, stages, ahead)


def decide(
    uri: str,
    text: str,
    hunks: Sequence[Hunk],
    language_id: str | None,
    *,
    floor: float = FLOOR,
    judge: Callable[[LatestEdit], Judge] | None = None,
    filler: Callable[[LatestEdit], Filler] | None = None,
    cancelled: Callable[[], bool] = lambda: False,
) -> Decision:
    """The rules' candidates for the latest of `hunks` (this document's, oldest first) in
    `text`, vetoed: what the server shows (the bench calls this too). `judge` makes the
    likelihood veto's judge for the latest edit (None: that veto is not applied); `filler`
    the model that writes what a candidate holds open (None: such candidates are not shown)."""
    edit = latest_edit(uri, text, hunks, language_id)
    if edit is None:
        return Decision()
    return vet(
        edit,
        propose(edit),
        floor=floor,
        judge=judge(edit) if judge is not None else None,
        filler=filler(edit) if filler is not None else None,
        cancelled=cancelled,
    )


def likelihood_judge(
    sources: EditSources,
    request: NextEditRequest,
    cancel: threading.Event | None,
    clock: StageClock,
) -> Callable[[LatestEdit], Judge] | None:
    """The likelihood veto's judge (context/edit_vetoes.py) over this request's backend, by the
    model `edits.likelihood_veto` names; None where it is off. A candidate is scored in its
    quick look's window first (where the model has one): kept when that finds it clearly
    likely, vetoed when it loses what the full window vetoes; between, its full window
    decides (`likely_enough`)."""
    scorer = sources.config.edits.likelihood_veto
    if scorer == "off":
        return None
    score = window_scorer(sources, request, cancel)

    def judged(edit: LatestEdit, candidate: Candidate) -> bool | None:
        full = likelihood_window(edit, candidate)
        if scorer in NEAR_GAIN:
            near = likelihood_window(edit, candidate, near=True)
            quick = score(near, scorer)
            if quick is None:
                return None
            if clearly_likely(*quick, model=scorer):
                return True
            # A loss the full window would veto is vetoed at a glance too; and in a short file
            # the quick look read the whole window.
            kept = likely_enough(*quick, model=scorer)
            if not kept or near == full:
                return kept
        scored = score(full, scorer)
        return None if scored is None else likely_enough(*scored, model=scorer)

    def judge_for(edit: LatestEdit) -> Judge:
        def judge(candidate: Candidate) -> bool | None:
            clock.lap("rules_ms")
            verdict = judged(edit, candidate)
            clock.lap("veto_ms")
            return verdict

        return judge

    return judge_for


def argument_filler(
    sources: EditSources,
    request: NextEditRequest,
    cancel: threading.Event | None,
    clock: StageClock,
) -> Callable[[LatestEdit], Filler] | None:
    """The model that writes an added parameter's argument at a call (`Candidate.fill_at`):
    the target, greedy, at most FILL_TOKENS tokens of a fill-in-the-middle prompt of the lines
    around the call (`fill_window`, the likelihood veto's window with the call's line open at
    the argument), in the document's next-edit cache slot, stopped once the argument ends
    (`argument_written`). None where `edits.fill_arguments` is off. A window longer than
    WINDOW_TOKENS, or a text that is no argument (empty, unbalanced, too long, not ended within
    the budget), fills nothing."""
    if not sources.config.edits.fill_arguments:
        return None
    prompts = sources.prompts
    template = prompts.template
    path = display_path(request.uri, sources.root)

    def filler_for(edit: LatestEdit) -> Filler:
        def fill(candidate: Candidate) -> Candidate | None:
            clock.lap("rules_ms")
            prefix, suffix = fill_window(edit, candidate)
            parts = template.render_parts(prefix, suffix, (), None, path, request.language_id)
            prompt = prompts.tokenize(
                Prompt(text="".join(p.text for p in parts), prefix="", suffix="", parts=parts),
                heal=False,
            )
            if len(prompt.ids) + FILL_TOKENS > WINDOW_TOKENS:
                return None  # very long lines: not worth a prefill that long
            written = sources.backend.fill(
                prompt.ids,
                max_new_tokens=FILL_TOKENS,
                ended=lambda text: argument_written(text)[1],
                slot=request.uri + EDIT_SLOT,
                language_id=request.language_id,
                cancel=cancel,
            )
            clock.lap("fill_ms")
            if written is None:
                return None
            raw, ended = argument_written(written.raw_text)
            ended = ended or written.stop_reason == "eos"  # the middle ended with it
            argument = raw.strip()
            if not ended or not argument or len(argument) >= ARGUMENT_MAX_CHARS:
                return None
            if argument_logprob(written, len(raw), prompts.tokenizer.decode) < FILL_LOGPROB:
                return None
            assert candidate.fill_at is not None
            text = candidate.edit.text
            whole = text[: candidate.fill_at] + argument + text[candidate.fill_at :]
            return dataclasses.replace(
                candidate,
                edit=dataclasses.replace(candidate.edit, text=whole),
                note=f"{candidate.note}: {argument}",
                fill_at=None,
            )

        return fill

    return filler_for


def argument_logprob(written: Generated, chars: int, decode: Callable[..., str]) -> float:
    """The summed log-probability of the tokens that spell the first `chars` characters of
    `written` (the argument; a token that spans its end counts whole); -inf where the backend
    gave no log-probabilities."""
    if len(written.choices) < len(written.tokens):
        return -math.inf
    total = 0.0
    for count, choice in enumerate(written.choices, start=1):
        total += choice.logprob
        if len(decode(written.tokens[:count], skip_special_tokens=True)) >= chars:
            break
    return total


def window_scorer(
    sources: EditSources, request: NextEditRequest, cancel: threading.Event | None
) -> Callable[[LikelihoodWindow, str], tuple[list[float], list[float]] | None]:
    """Scores a likelihood window with a model: the window as a fill-in-the-middle prompt (the
    template's, the document's path), its changed lines as they are and as the candidate
    leaves them as the two middles, each closed by the template's end token, in the document's
    next-edit cache slot (the completion cache stays as it is). The middles' shared first
    tokens join the prompt: they score the same in both, so only what follows them is
    computed twice (with every position's logits). The two scores' sums differ as the whole
    middles' do. None: not scored (too long, a backend that cannot score, cancelled)."""
    prompts = sources.prompts
    template = prompts.template
    path = display_path(request.uri, sources.root)
    end = list(prompts.cache.ids(template.stop_tokens[0]))

    def score(window: LikelihoodWindow, model: str) -> tuple[list[float], list[float]] | None:
        parts = template.render_parts(
            window.prefix, window.suffix, (), None, path, request.language_id
        )
        prompt = prompts.tokenize(
            Prompt(text="".join(p.text for p in parts), prefix="", suffix="", parts=parts),
            heal=False,
        )
        old, new = (
            [*prompts.cache.ids(template.sanitize(middle)), *end]
            for middle in (window.old, window.new)
        )
        if len(prompt.ids) + len(old) + len(new) > WINDOW_TOKENS:
            return None
        shared = min(common_prefix_length(old, new), min(len(old), len(new)) - 1)
        scored = sources.backend.likelihoods(
            [*prompt.ids, *old[:shared]],
            [old[shared:], new[shared:]],
            slot=request.uri + EDIT_SLOT,
            model=model,
            cancel=cancel,
            deadline=None,
        )
        return None if scored is None else (scored[0], scored[1])

    return score


def rests_away(request: NextEditRequest) -> bool:
    """Whether the request's cursor is off the lines of the document's latest edit (and the
    line either side), or the document has none: where a person rests before editing."""
    lines = edited_lines(request.hunks)
    return lines is None or not lines[0] - 1 <= request.line <= lines[1] + 1


def warm_window_head(
    sources: EditSources, request: NextEditRequest, cancel: threading.Event | None
) -> int:
    """Compute ahead the likelihood veto's window head for an edit that may start on the
    cursor's line (`edit_vetoes.window_head`: how every full window of a candidate below such
    an edit opens) in the scoring model's cache, slot HEAD_SLOT; the tokens computed. The
    full window adopts it, so after the edit only the lines from the edit on are computed
    (about 100-150 fewer tokens of the draft's, near a second on a 2-core CPU). Nothing
    where the veto or the work ahead (`cache.warmup`) is off, or the template puts the suffix
    first."""
    scorer = sources.config.edits.likelihood_veto
    if scorer == "off" or not sources.config.edits.rules or not sources.config.cache.warmup:
        return 0
    head = window_head(request.text, request.line)
    prompts = sources.prompts
    parts = prompts.template.render_parts(
        head, "", (), None, display_path(request.uri, sources.root), request.language_id
    )
    leading = []
    for part in parts:
        if part.role == "suffix":
            return 0
        leading.append(part)
        if part.role == "prefix":
            break
    else:
        return 0  # no lines above the cursor
    text = "".join(part.text for part in leading)
    ids = prompts.tokenize(Prompt(text=text, prefix="", suffix="", parts=leading), heal=False).ids
    if len(ids) > WINDOW_TOKENS:  # a window that long is not scored (very long lines)
        return 0
    return sources.backend.prefill(ids, slot=request.uri + HEAD_SLOT, model=scorer, cancel=cancel)


def _context_files(sources: EditSources, uri: str) -> list[ContextFile]:
    """The workspace head's chunks of the other open files, within the snippet budget."""
    context = sources.config.context
    budget = int(prompt_tokens(context) * context.snippet_share)
    own = sources.head.chunk_of(uri)
    files, used = [], 0
    for chunk in sources.head.snippets():
        if chunk is own:
            continue
        cost = sources.count_tokens(chunk.text)
        if used + cost > budget:
            break
        used += cost
        files.append(ContextFile(display_path(chunk.path, sources.root), chunk.text))
    return files


def edited_lines(hunks: Sequence[Hunk]) -> tuple[int, int] | None:
    """The first and last line the latest of this document's hunks holds now (a deletion:
    the line it left), or None without one."""
    if not hunks:
        return None
    latest = hunks[-1]
    return latest.start_line, latest.start_line + max(len(latest.new_lines) - 1, 0)


def prepare(
    sources: EditSources, request: NextEditRequest, *, clock: StageClock | None = None
) -> PreparedEdit:
    """The region, the prompt and its tokens for `request`. Raises PositionError for a cursor
    outside the document."""
    clock = clock or StageClock()
    offset = cursor_offset(request)
    config = sources.config.edits
    path = display_path(request.uri, sources.root)
    region = choose_region(
        request.text,
        offset,
        lines_above=config.lines_above,
        lines_below=config.lines_below,
        language_id=request.language_id,
        path=path,
        edited=edited_lines(request.hunks),
    )
    root = sources.root
    hunks = [(display_path(h.uri, root), h) for h in (*request.other_hunks, *request.hunks)]
    context = EditContext(
        region=region,
        path=path,
        language_id=request.language_id,
        hunks=hunks,
        files=_context_files(sources, request.uri),
        special_tokens=sources.prompts.template.special_tokens,
    )
    prompt = render_edit_prompt(edit_format(sources), context)
    clock.lap("context_ms")
    tokens = sources.prompts.tokenize(
        Prompt(text=prompt.text, prefix="", suffix="", parts=prompt.parts), heal=False
    )
    copy_source = list(sources.prompts.cache.ids(prompt.answer))
    limit = min(config.max_new_tokens, 2 * len(copy_source) + ANSWER_TOKENS_SLACK)
    clock.lap("tokenize_ms")
    return PreparedEdit(
        request=request,
        region=region,
        prompt=prompt,
        prompt_ids=tokens.ids,
        copy_source=copy_source,
        max_new_tokens=limit,
        tokenizer=sources.prompts.tokenizer,
    )


def suggest(
    sources: EditSources,
    request: NextEditRequest,
    *,
    cancel: threading.Event | None = None,
    strategy: str | None = None,
    decided: DecidedEdit | None = None,
) -> NextEdit:
    """The next edit at the request's cursor: the rules' candidate the vetoes kept (`decided`:
    the decision made ahead for this version of the document, else made now); else the
    model's rewrite where it runs (no edits when the model keeps the region as it is, or when
    its rewrite is refused: `NextEdit.rejected` says why); else none, and at a cursor resting
    away from the latest edit the veto's window head is computed for an edit there."""
    started = time.perf_counter()
    clean = without_lone_surrogates(request.text)
    if clean is not request.text:
        request = dataclasses.replace(request, text=clean)  # offsets unchanged
    skipped = skip_reason(sources, request)
    if skipped is not None:
        return NextEdit(skipped=skipped)
    decided = decided or decide_rules(sources, request, cancel=cancel)
    if decided is None:
        return NextEdit(skipped="cancelled")
    decision = decided.decision
    found = {
        "candidates": decision.candidates,
        "vetoed": dict(decision.vetoed),
        "judged": decision.scored,
        "filled": decision.filled,
        "ahead": decided.ahead,
    }
    if decision.shown is not None:
        shown = decision.shown
        return NextEdit(
            edits=[Edit(shown.edit.start, shown.edit.end, shown.edit.text)],
            mode="rule",
            stop_reason="rule",
            latency_ms=(time.perf_counter() - started) * 1000,
            stages=dict(decided.stages),
            rule=shown.rule,
            confidence=shown.confidence,
            **found,
        )
    clock = StageClock()
    if not model_rewrites(sources):
        head_tokens = 0
        if rests_away(request):
            head_tokens = warm_window_head(sources, request, cancel)
            clock.lap("head_ms")
        return NextEdit(
            mode="rule",
            latency_ms=(time.perf_counter() - started) * 1000,
            stages={**decided.stages, **clock.stages},
            abstained=(
                "no rule candidate survived the vetoes, and the model's rewrite is off for a "
                "model not trained for next edits (edits.model_rewrite)"
            ),
            head_tokens=head_tokens,
            **found,
        )
    prepared = prepare(sources, request, clock=clock)
    generated = generate_step(
        lambda deadline: sources.backend.generate_edit(
            prepared, strategy=strategy, cancel=cancel, deadline=deadline
        ),
        sources.config.decoding,
        clock,
    )
    region = prepared.region
    ended = generated.stop_reason in ("eos", "stop")
    raw = generated.raw_text
    cut = None if prepared.prompt.closed(raw) else overrun_start(region, raw)
    if cut is not None:  # stopped where the answer went on past the region
        rewritten: str | None = raw[:cut]
    else:
        rewritten = prepared.prompt.region_of(raw, ended)
    if rewritten is not None:
        rewritten = without_overrun(region, rewritten)
    edits = minimal_edits(region.text, rewritten, region.start) if rewritten is not None else []
    rejected = reject_reason(region.text, rewritten, edits)
    if rejected is not None:
        edits = []
    clock.lap("diff_ms")
    stats = generated.stats
    stages = {**decided.stages, **stages_of(clock, stats)}
    return NextEdit(
        edits=edits,
        region=region,
        format=prepared.prompt.format,
        rewritten=rewritten,
        raw_text=generated.raw_text,
        tokens=generated.tokens,
        stop_reason=generated.stop_reason,
        stats=stats,
        prompt_tokens=len(prepared.prompt_ids),
        latency_ms=(time.perf_counter() - started) * 1000,
        stages=stages,
        rejected=rejected,
        **found,
    )
