// `$/quickdraft/stats` notifications -> the status bar text and tooltip.
//
// Pure logic, no `vscode` import (tested by `npm test`).

/** The params of `$/quickdraft/stats`; fields the server does not send are simply absent. */
export interface QuickdraftStats {
  latency_ms?: number;
  /** true when the answer took no model work (typed-ahead or prefetched) */
  cached?: boolean;
  /** "model" | "typed-ahead" | "prefetch" | "shared" */
  source?: string;
  tokens?: number;
  tokens_per_forward?: number;
  target_forwards?: number;
  accepted_by_source?: Record<string, number>;
  drafted_by_source?: Record<string, number>;
  [key: string]: unknown;
}

/**
 * The notification's params with snake_case keys (the server may send `latencyMs`,
 * `tokensPerForward`, `acceptedBySource`, ... or their snake_case forms).
 */
export function normalizeStats(raw: unknown): QuickdraftStats {
  if (!raw || typeof raw !== "object" || Array.isArray(raw)) {
    return {};
  }
  const out: QuickdraftStats = {};
  for (const [key, value] of Object.entries(raw as Record<string, unknown>)) {
    const snake = key.replace(/(?<!^)(?=[A-Z])/g, "_").toLowerCase();
    if (!(snake in out) || snake === key) {
      out[snake] = value;
    }
  }
  return out;
}

function finite(value: unknown): number | undefined {
  return typeof value === "number" && Number.isFinite(value) ? value : undefined;
}

function sumCounts(counts: unknown): number | undefined {
  if (!counts || typeof counts !== "object" || Array.isArray(counts)) {
    return undefined;
  }
  let total = 0;
  for (const value of Object.values(counts as Record<string, unknown>)) {
    const n = finite(value);
    if (n !== undefined && n > 0) {
      total += n;
    }
  }
  return total;
}

function milliseconds(ms: number): string {
  return ms >= 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

/** Whether the server reported fewer than one token per forward for a computed answer. */
export function tooFewTokensPerForward(stats: QuickdraftStats): boolean {
  const tpf = finite(stats.tokens_per_forward);
  const tokens = finite(stats.tokens);
  return stats.cached !== true && tpf !== undefined && tpf < 1 && (tokens === undefined || tokens > 0);
}

/**
 * What made one completion fast, for a person: `cached` (answered with no model work),
 * `copied`/`drafted` N of its M new tokens (they came from drafts the model accepted: `copied`
 * when all from the n-gram drafter, i.e. text copied from the open files, `drafted` when the
 * draft model proposed some), or undefined: no draft was tried (`drafted_by_source` empty or all
 * zeros), or none was accepted. The same rule as the Neovim plugin's stats.speedup.
 */
export type Speedup = { kind: "cached" } | { kind: "copied" | "drafted"; accepted: number; tokens: number };

export function speedup(stats: QuickdraftStats): Speedup | undefined {
  if (stats.cached === true) {
    return { kind: "cached" };
  }
  const drafted = sumCounts(stats.drafted_by_source);
  const accepted = sumCounts(stats.accepted_by_source);
  const tokens = finite(stats.tokens);
  if (!drafted || !accepted || tokens === undefined || tokens <= 0) {
    return undefined;
  }
  const ngram = finite((stats.accepted_by_source as Record<string, unknown> | undefined)?.ngram) ?? 0;
  return { kind: accepted - ngram > 0 ? "drafted" : "copied", accepted: Math.min(accepted, tokens), tokens };
}

/** The latency and what sped it up: `84 ms · copied 12 of 15 tokens`, `2 ms · cached`, `310 ms`. */
export function formatLast(stats: QuickdraftStats): string {
  const latency = finite(stats.latency_ms);
  const parts = latency !== undefined ? [milliseconds(latency)] : [];
  const fast = speedup(stats);
  if (fast?.kind === "cached") {
    parts.push("cached");
  } else if (fast) {
    parts.push(`${fast.kind} ${fast.accepted} of ${fast.tokens} tokens`);
  }
  return parts.length > 0 ? parts.join(" · ") : "—";
}

/**
 * One line for the status bar: `$(zap) quickdraft ready` before any completion, then e.g.
 * `$(zap) 84 ms · copied 12 of 15 tokens`, `$(zap) 2 ms · cached` or `$(zap) 310 ms`.
 */
export function formatStatusText(stats: QuickdraftStats | undefined): string {
  return stats ? `$(zap) ${formatLast(stats)}` : "$(zap) quickdraft ready";
}

const SOURCE_NAMES: Record<string, string> = { ngram: "copied from open files", draft: "draft model" };

/** The last completion in detail: tokens, forwards of the model, the drafts by source. */
export function formatDetails(stats: QuickdraftStats): string {
  if (stats.cached === true) {
    const source = typeof stats.source === "string" && stats.source !== "" ? ` (${stats.source})` : "";
    return `answered from work done before${source}, no model work`;
  }
  const parts = [`${finite(stats.tokens) ?? 0} tokens`];
  const forwards = finite(stats.target_forwards);
  if (forwards !== undefined && forwards > 0) {
    parts.push(`${forwards} forwards of the model`);
  }
  const drafted = (stats.drafted_by_source ?? {}) as Record<string, unknown>;
  const accepted = (stats.accepted_by_source ?? {}) as Record<string, unknown>;
  const sources = Object.keys(drafted)
    .filter((source) => (finite(drafted[source]) ?? 0) > 0)
    .map(
      (source) =>
        `${SOURCE_NAMES[source] ?? source} ${finite(accepted[source]) ?? 0} of ${finite(drafted[source])} accepted`,
    )
    .sort();
  parts.push(sources.length > 0 ? `drafts: ${sources.join(", ")}` : "no drafts tried");
  return parts.join(", ");
}

/** Running totals over the session, for the tooltip and `:QuickdraftStatus`-like views. */
export class StatsTotals {
  /** every answered request, cached ones included */
  completions = 0;
  /** answers without model work */
  cached = 0;
  tokens = 0;
  /** new tokens that came from accepted drafts */
  accepted = 0;
  drafted = 0;
  /** over the computed answers only */
  latencyMs = 0;
  last: QuickdraftStats | undefined;

  add(stats: QuickdraftStats): void {
    this.last = stats;
    this.completions += 1;
    if (stats.cached === true) {
      this.cached += 1;
      return;
    }
    this.tokens += finite(stats.tokens) ?? 0;
    this.latencyMs += finite(stats.latency_ms) ?? 0;
    const fast = speedup(stats);
    this.accepted += fast && fast.kind !== "cached" ? fast.accepted : 0;
    this.drafted += sumCounts(stats.drafted_by_source) ?? 0;
  }

  /** mean latency of the computed answers */
  get meanLatencyMs(): number | undefined {
    const computed = this.completions - this.cached;
    return computed > 0 ? this.latencyMs / computed : undefined;
  }
}

/** The tooltip: `headline`, the last completion in detail, then the session's totals. */
export function formatTooltip(totals: StatsTotals, headline: string): string {
  const lines = [headline];
  const last = totals.last;
  if (!last) {
    lines.push("No completion yet.");
    return lines.join("\n");
  }
  lines.push(`Last: ${formatLast(last)}`, formatDetails(last));
  const mean = totals.meanLatencyMs;
  lines.push(
    `Session: ${totals.completions} completions` +
      (totals.cached > 0 ? ` (${totals.cached} cached)` : "") +
      `, ${totals.tokens} tokens` +
      (totals.accepted > 0 ? ` (${totals.accepted} from drafts)` : "") +
      (mean !== undefined ? `, mean ${milliseconds(mean)}` : ""),
  );
  return lines.join("\n");
}

/** `feature` of the `$/quickdraft/stats` that follow a next edit (`textDocument/copilotInlineEdit`). */
export const NEXT_EDIT_FEATURE = "inlineEdit";

/** Whether `stats` report a next edit (they never count as completions). */
export function isNextEditStats(stats: QuickdraftStats): boolean {
  return stats.feature === NEXT_EDIT_FEATURE;
}

function tokensPerForward(stats: QuickdraftStats): string | undefined {
  const tpf = finite(stats.tokens_per_forward);
  return tpf !== undefined ? `${tpf.toFixed(1)} tokens/forward` : undefined;
}

/** The rule that made a next edit and its confidence (`rename 0.90`), when a rule did. */
function ruleOf(stats: QuickdraftStats): string | undefined {
  if (typeof stats.rule !== "string" || stats.rule === "") {
    return undefined;
  }
  const confidence = finite(stats.confidence);
  return confidence !== undefined ? `${stats.rule} ${confidence.toFixed(2)}` : stats.rule;
}

/** The vetoes that removed candidates (`undo 1, parse 2`), when any did. */
function vetoesOf(stats: QuickdraftStats): string | undefined {
  const vetoed = stats.vetoed;
  if (!vetoed || typeof vetoed !== "object" || Array.isArray(vetoed)) {
    return undefined;
  }
  const parts = Object.entries(vetoed as Record<string, unknown>)
    .filter(([, n]) => (finite(n) ?? 0) > 0)
    .map(([name, n]) => `${name} ${String(n)}`);
  return parts.length > 0 ? parts.join(", ") : undefined;
}

/**
 * The last next edit for the status bar: `next edit · rename 0.90 · 38 ms` for one a rule made
 * (no model work, so no tokens per forward), `next edit · 45 ms · 3.2 tokens/forward` for the
 * model's rewrite.
 */
export function formatNextEdit(stats: QuickdraftStats | undefined): string {
  const parts = ["next edit"];
  const rule = stats && ruleOf(stats);
  if (rule) {
    parts.push(rule);
  }
  const latency = stats && finite(stats.latency_ms);
  if (latency !== undefined) {
    parts.push(milliseconds(latency));
  }
  const tpf = stats && !rule && (finite(stats.target_forwards) ?? 1) > 0 ? tokensPerForward(stats) : undefined;
  if (tpf) {
    parts.push(tpf);
  }
  return parts.join(" · ");
}

/**
 * The last next edit in detail: `2 edits, 40 tokens (36 copied from the region), 11 forwards of
 * the model, 3.6 tokens/forward, region lines 4-20`, or why the model's answer was refused.
 */
export function formatNextEditDetails(stats: QuickdraftStats): string {
  const parts: string[] = [];
  const edits = finite(stats.edit_count);
  if (edits !== undefined) {
    parts.push(edits === 1 ? "1 edit" : `${edits} edits`);
  }
  const rule = ruleOf(stats);
  if (rule) {
    parts.push(`rule ${rule}`);
  }
  const vetoes = vetoesOf(stats);
  if (vetoes) {
    parts.push(`vetoed: ${vetoes}`);
  }
  const tokens = finite(stats.tokens);
  if (tokens !== undefined) {
    const copied = finite(stats.copied_tokens);
    parts.push(`${tokens} tokens${copied !== undefined && copied > 0 ? ` (${copied} copied from the region)` : ""}`);
  }
  const forwards = finite(stats.target_forwards);
  if (forwards !== undefined && forwards > 0) {
    parts.push(`${forwards} forwards of the model`);
  }
  const tpf = forwards !== 0 ? tokensPerForward(stats) : undefined;
  if (tpf) {
    parts.push(tpf);
  }
  const region = stats.region_lines;
  if (Array.isArray(region) && region.length === 2 && region.every((n) => finite(n) !== undefined)) {
    // [first line, the line after the last], 0-based: 1-based inclusive for a person
    parts.push(`region lines ${Number(region[0]) + 1}-${Number(region[1])}`);
  }
  if (typeof stats.rejected === "string" && stats.rejected !== "") {
    parts.push(`refused: ${stats.rejected}`);
  }
  if (typeof stats.abstained === "string" && stats.abstained !== "") {
    parts.push(`no edit: ${stats.abstained}`);
  }
  const latency = finite(stats.latency_ms);
  const head = latency !== undefined ? `${milliseconds(latency)}: ` : "";
  return head + (parts.length > 0 ? parts.join(", ") : "no details");
}
