import { strict as assert } from "node:assert";
import { test } from "node:test";

import {
  acceptance,
  formatStatusText,
  formatTooltip,
  normalizeStats,
  shownTokensPerForward,
  StatsTotals,
  tooFewTokensPerForward,
} from "../src/stats";

test("status text before any completion", () => {
  assert.equal(formatStatusText(undefined), "$(zap) quickdraft");
});

test("status text with latency, tokens per forward and acceptance rate", () => {
  const text = formatStatusText({
    latency_ms: 83.6,
    tokens: 20,
    tokens_per_forward: 2.66,
    accepted_by_source: { ngram: 6, draft: 6 },
    drafted_by_source: { ngram: 8, draft: 8 },
  });
  assert.equal(text, "$(zap) 84 ms · 2.7 tok/fwd · 75% acc");
});

test("without drafted counts the share of tokens that came from drafts is shown", () => {
  const text = formatStatusText({ latency_ms: 12000, tokens: 10, accepted_by_source: { ngram: 4 } });
  assert.equal(text, "$(zap) 12.0 s · 40% drafted");
});

test("missing or malformed fields do not break the text", () => {
  assert.equal(formatStatusText({}), "$(zap) —");
  assert.equal(formatStatusText({ latency_ms: Number.NaN, tokens_per_forward: "x" as unknown as number }), "$(zap) —");
  assert.equal(acceptance({ accepted_by_source: { ngram: -1, draft: "3" as unknown as number } })?.accepted, 0);
  assert.equal(acceptance({ tokens: 3 }), undefined);
});

test("acceptance rate is capped at 100%", () => {
  assert.equal(acceptance({ accepted_by_source: { draft: 9 }, drafted_by_source: { draft: 4 } })?.rate, 1);
});

test("totals accumulate over completions and feed the tooltip", () => {
  const totals = new StatsTotals();
  assert.match(formatTooltip(totals, "quickdraft — server running"), /No completion yet/);
  totals.add({ latency_ms: 100, tokens: 10, accepted_by_source: { ngram: 3 }, drafted_by_source: { ngram: 4 } });
  totals.add({ latency_ms: 50, tokens: 6, accepted_by_source: { draft: 1 }, drafted_by_source: { draft: 4 } });
  assert.equal(totals.completions, 2);
  assert.equal(totals.tokens, 16);
  assert.equal(totals.meanLatencyMs, 75);
  assert.equal(totals.acceptanceRate, 0.5);
  const tooltip = formatTooltip(totals, "quickdraft — server running");
  assert.match(tooltip, /server running/);
  assert.match(tooltip, /Last: 50 ms, 6 tokens/);
  assert.match(tooltip, /Accepted by source: draft 1\/4/);
  assert.match(tooltip, /Session: 2 completions, 16 tokens, mean 75 ms, 50% of drafted tokens accepted/);
});

test("camelCase params from the server are read as their snake_case fields", () => {
  const stats = normalizeStats({
    latencyMs: 41.2,
    tokens: 8,
    tokensPerForward: 3.2,
    acceptedBySource: { ngram: 3 },
    draftedBySource: { ngram: 4 },
    cached: false,
  });
  assert.deepEqual(stats, {
    latency_ms: 41.2,
    tokens: 8,
    tokens_per_forward: 3.2,
    accepted_by_source: { ngram: 3 },
    drafted_by_source: { ngram: 4 },
    cached: false,
  });
  assert.equal(formatStatusText(stats), "$(zap) 41 ms · 3.2 tok/fwd · 75% acc");
  // a snake_case key wins over its camelCase twin
  assert.equal(normalizeStats({ latencyMs: 1, latency_ms: 2 }).latency_ms, 2);
  assert.equal(normalizeStats({ latency_ms: 2, latencyMs: 1 }).latency_ms, 2);
  assert.deepEqual(normalizeStats(null), {});
  assert.deepEqual(normalizeStats([1]), {});
});

test("a cached answer shows 'cached', never '0 ms · 0.0 tok/fwd'", () => {
  const stats = normalizeStats({ latencyMs: 0.2, cached: true, source: "typed-ahead", tokens: 0, tokensPerForward: 0 });
  assert.equal(formatStatusText(stats), "$(zap) cached");
  assert.equal(shownTokensPerForward(stats), undefined);
  assert.equal(tooFewTokensPerForward(stats), false);
});

test("tokens per forward is never shown below 1 for a computed answer", () => {
  const low = { latency_ms: 900, tokens: 8, tokens_per_forward: 0.8, cached: false };
  assert.equal(formatStatusText(low), "$(zap) 900 ms · 1.0 tok/fwd");
  assert.equal(shownTokensPerForward(low), 1);
  assert.equal(tooFewTokensPerForward(low), true);
  assert.equal(tooFewTokensPerForward({ tokens: 8, tokens_per_forward: 1.6 }), false);
  // an empty answer has no tokens per forward to show
  const empty = { latency_ms: 50, tokens: 0, tokens_per_forward: 0, cached: false };
  assert.equal(formatStatusText(empty), "$(zap) 50 ms");
  assert.equal(tooFewTokensPerForward(empty), false);
  const totals = new StatsTotals();
  totals.add(low);
  assert.match(formatTooltip(totals, "h"), /Last: 900 ms, 8 tokens, 1.00 tokens per forward/);
});

test("cached answers are counted apart and leave the mean latency of computed ones alone", () => {
  const totals = new StatsTotals();
  totals.add({ latency_ms: 100, tokens: 10, cached: false });
  totals.add({ latency_ms: 1, tokens: 0, cached: true });
  totals.add({ latency_ms: 50, tokens: 6, cached: false });
  assert.equal(totals.completions, 3);
  assert.equal(totals.cached, 1);
  assert.equal(totals.tokens, 16);
  assert.equal(totals.meanLatencyMs, 75);
  assert.match(formatTooltip(totals, "h"), /Session: 3 completions \(1 cached\), 16 tokens, mean 75 ms/);
});
