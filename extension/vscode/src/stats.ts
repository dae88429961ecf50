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

export interface Acceptance {
  /** accepted / drafted when the server says how many were drafted, else undefined */
  rate?: number;
  accepted: number;
  drafted?: number;
  /** share of the produced tokens that came from accepted drafts */
  share?: number;
}

/** How much of what the drafters proposed the target accepted, for one completion. */
export function acceptance(stats: QuickdraftStats): Acceptance | undefined {
  const accepted = sumCounts(stats.accepted_by_source);
  if (accepted === undefined) {
    return undefined;
  }
  const drafted = sumCounts(stats.drafted_by_source);
  const tokens = finite(stats.tokens);
  return {
    accepted,
    drafted,
    rate: drafted !== undefined && drafted > 0 ? Math.min(1, accepted / drafted) : undefined,
    share: tokens !== undefined && tokens > 0 ? Math.min(1, accepted / tokens) : undefined,
  };
}

function percent(fraction: number): string {
  return `${Math.round(fraction * 100)}%`;
}

function milliseconds(ms: number): string {
  return ms >= 10000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

/**
 * Tokens per target forward as shown: undefined for a cached answer (no forward) or one without
 * tokens; never below 1 for a computed answer (every forward yields at least one token, so a
 * smaller figure is a counting slip on the server's side: `tooFewTokensPerForward` finds it).
 */
export function shownTokensPerForward(stats: QuickdraftStats): number | undefined {
  const tpf = finite(stats.tokens_per_forward);
  if (stats.cached === true || tpf === undefined || finite(stats.tokens) === 0) {
    return undefined;
  }
  return Math.max(1, tpf);
}

/** Whether the server reported fewer than one token per forward for a computed answer. */
export function tooFewTokensPerForward(stats: QuickdraftStats): boolean {
  const tpf = finite(stats.tokens_per_forward);
  const tokens = finite(stats.tokens);
  return stats.cached !== true && tpf !== undefined && tpf < 1 && (tokens === undefined || tokens > 0);
}

/** One line for the status bar, e.g. `$(zap) 84 ms · 2.7 tok/fwd · 71% acc`, or `$(zap) cached`. */
export function formatStatusText(stats: QuickdraftStats | undefined): string {
  if (!stats) {
    return "$(zap) quickdraft";
  }
  if (stats.cached === true) {
    return "$(zap) cached";
  }
  const parts: string[] = [];
  const latency = finite(stats.latency_ms);
  parts.push(latency !== undefined ? milliseconds(latency) : "—");
  const tpf = shownTokensPerForward(stats);
  if (tpf !== undefined) {
    parts.push(`${tpf.toFixed(1)} tok/fwd`);
  }
  const acc = acceptance(stats);
  if (acc?.rate !== undefined) {
    parts.push(`${percent(acc.rate)} acc`);
  } else if (acc?.share !== undefined) {
    parts.push(`${percent(acc.share)} drafted`);
  }
  return `$(zap) ${parts.join(" · ")}`;
}

/** Running totals over the session, for the tooltip and `:QuickdraftStatus`-like views. */
export class StatsTotals {
  /** every answered request, cached ones included */
  completions = 0;
  /** answers without model work */
  cached = 0;
  tokens = 0;
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
    const acc = acceptance(stats);
    if (acc) {
      this.accepted += acc.accepted;
      this.drafted += acc.drafted ?? 0;
    }
  }

  /** mean latency of the computed answers */
  get meanLatencyMs(): number | undefined {
    const computed = this.completions - this.cached;
    return computed > 0 ? this.latencyMs / computed : undefined;
  }

  get acceptanceRate(): number | undefined {
    return this.drafted > 0 ? Math.min(1, this.accepted / this.drafted) : undefined;
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
  const latency = finite(last.latency_ms);
  const tokens = finite(last.tokens);
  const tpf = shownTokensPerForward(last);
  if (last.cached === true) {
    const source = typeof last.source === "string" && last.source !== "" ? ` (${last.source})` : "";
    lines.push(
      `Last: cached${source}, no model work, answered in ${latency !== undefined ? milliseconds(latency) : "—"}`,
    );
  } else {
    lines.push(
      `Last: ${latency !== undefined ? milliseconds(latency) : "—"}, ` +
        `${tokens ?? "—"} tokens, ${tpf !== undefined ? tpf.toFixed(2) : "—"} tokens per forward`,
    );
  }
  const bySource = last.accepted_by_source;
  if (bySource && typeof bySource === "object") {
    const drafted = (last.drafted_by_source ?? {}) as Record<string, number>;
    const parts = Object.entries(bySource)
      .filter(([, n]) => typeof n === "number")
      .map(([source, n]) =>
        typeof drafted[source] === "number" ? `${source} ${n}/${drafted[source]}` : `${source} ${n}`,
      );
    if (parts.length > 0) {
      lines.push(`Accepted by source: ${parts.join(", ")}`);
    }
  }
  const mean = totals.meanLatencyMs;
  const rate = totals.acceptanceRate;
  lines.push(
    `Session: ${totals.completions} completions` +
      (totals.cached > 0 ? ` (${totals.cached} cached)` : "") +
      `, ${totals.tokens} tokens` +
      (mean !== undefined ? `, mean ${milliseconds(mean)}` : "") +
      (rate !== undefined ? `, ${percent(rate)} of drafted tokens accepted` : ""),
  );
  return lines.join("\n");
}
