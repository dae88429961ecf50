import { strict as assert } from "node:assert";
import { test } from "node:test";

import {
  formatDetails,
  formatLast,
  formatNextEdit,
  formatNextEditDetails,
  formatStatusText,
  formatTooltip,
  isNextEditStats,
  normalizeStats,
  speedup,
  StatsTotals,
  tooFewTokensPerForward,
} from "../src/stats";

test("status text before any completion says ready", () => {
  assert.equal(formatStatusText(undefined), "$(zap) quickdraft ready");
});

test("drafts accepted: N of the M new tokens, 'copied' when all came from the n-gram drafter", () => {
  const copied = {
    latency_ms: 83.6,
    tokens: 15,
    tokens_per_forward: 2.5,
    accepted_by_source: { ngram: 12, draft: 0 },
    drafted_by_source: { ngram: 14, draft: 0 },
  };
  assert.equal(formatStatusText(copied), "$(zap) 84 ms · copied 12 of 15 tokens");
  assert.deepEqual(speedup(copied), { kind: "copied", accepted: 12, tokens: 15 });
  const mixed = {
    latency_ms: 83.6,
    tokens: 20,
    accepted_by_source: { ngram: 6, draft: 6 },
    drafted_by_source: { ngram: 8, draft: 8 },
  };
  assert.equal(formatStatusText(mixed), "$(zap) 84 ms · drafted 12 of 20 tokens");
  // more accepted than kept (the answer was trimmed after): never more than the tokens
  const trimmed = { latency_ms: 12000, tokens: 10, accepted_by_source: { ngram: 14 }, drafted_by_source: { ngram: 16 } };
  assert.equal(formatStatusText(trimmed), "$(zap) 12.0 s · copied 10 of 10 tokens");
});

test("no draft tried: the latency alone, never '1.0 tok/fwd · 0% acc'", () => {
  const plain = {
    latency_ms: 310,
    tokens: 15,
    tokens_per_forward: 1.0,
    accepted_by_source: { ngram: 0, draft: 0 },
    drafted_by_source: { ngram: 0, draft: 0 },
  };
  assert.equal(formatStatusText(plain), "$(zap) 310 ms");
  assert.equal(speedup(plain), undefined);
  assert.equal(formatStatusText({ latency_ms: 310, tokens: 15, accepted_by_source: {}, drafted_by_source: {} }), "$(zap) 310 ms");
  assert.equal(formatStatusText({ latency_ms: 310, tokens: 15 }), "$(zap) 310 ms");
  // drafts tried, none accepted: nothing sped it up
  assert.equal(
    formatStatusText({ latency_ms: 310, tokens: 15, accepted_by_source: { ngram: 0 }, drafted_by_source: { ngram: 4 } }),
    "$(zap) 310 ms",
  );
});

test("missing or malformed fields do not break the text", () => {
  assert.equal(formatStatusText({}), "$(zap) —");
  assert.equal(formatStatusText({ latency_ms: Number.NaN, tokens_per_forward: "x" as unknown as number }), "$(zap) —");
  assert.equal(
    formatLast({ latency_ms: 5, tokens: 3, accepted_by_source: { ngram: -1, draft: "3" as unknown as number }, drafted_by_source: { ngram: 2 } }),
    "5 ms",
  );
});

test("details: tokens, forwards of the model and the drafts by source", () => {
  assert.equal(
    formatDetails(
      normalizeStats({
        latencyMs: 84,
        tokens: 15,
        targetForwards: 6,
        acceptedBySource: { ngram: 12, draft: 0 },
        draftedBySource: { ngram: 14, draft: 3 },
      }),
    ),
    "15 tokens, 6 forwards of the model, drafts: copied from open files 12 of 14 accepted, draft model 0 of 3 accepted",
  );
  assert.equal(
    formatDetails({ tokens: 15, target_forwards: 15, drafted_by_source: { ngram: 0, draft: 0 } }),
    "15 tokens, 15 forwards of the model, no drafts tried",
  );
  assert.equal(formatDetails({ cached: true, source: "typed-ahead" }), "answered from work done before (typed-ahead), no model work");
});

test("totals accumulate over completions and feed the tooltip", () => {
  const totals = new StatsTotals();
  assert.match(formatTooltip(totals, "quickdraft — server running"), /No completion yet/);
  totals.add({ latency_ms: 100, tokens: 10, accepted_by_source: { ngram: 3 }, drafted_by_source: { ngram: 4 } });
  totals.add({ latency_ms: 50, tokens: 6, accepted_by_source: { draft: 1 }, drafted_by_source: { draft: 4 } });
  assert.equal(totals.completions, 2);
  assert.equal(totals.tokens, 16);
  assert.equal(totals.accepted, 4);
  assert.equal(totals.drafted, 8);
  assert.equal(totals.meanLatencyMs, 75);
  const tooltip = formatTooltip(totals, "quickdraft — server running");
  assert.match(tooltip, /server running/);
  assert.match(tooltip, /Last: 50 ms · drafted 1 of 6 tokens\n6 tokens, drafts: draft model 1 of 4 accepted/);
  assert.match(tooltip, /Session: 2 completions, 16 tokens \(4 from drafts\), mean 75 ms/);
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
  assert.equal(formatStatusText(stats), "$(zap) 41 ms · copied 3 of 8 tokens");
  // a snake_case key wins over its camelCase twin
  assert.equal(normalizeStats({ latencyMs: 1, latency_ms: 2 }).latency_ms, 2);
  assert.equal(normalizeStats({ latency_ms: 2, latencyMs: 1 }).latency_ms, 2);
  assert.deepEqual(normalizeStats(null), {});
  assert.deepEqual(normalizeStats([1]), {});
});

test("a cached answer shows its latency and 'cached', never '0.0 tok/fwd'", () => {
  const stats = normalizeStats({ latencyMs: 2.2, cached: true, source: "typed-ahead", tokens: 0, tokensPerForward: 0 });
  assert.equal(formatStatusText(stats), "$(zap) 2 ms · cached");
  assert.equal(formatStatusText({ cached: true }), "$(zap) cached");
  assert.equal(tooFewTokensPerForward(stats), false);
});

test("a computed answer with fewer than one token per forward is noticed, not shown", () => {
  const low = { latency_ms: 900, tokens: 8, tokens_per_forward: 0.8, cached: false };
  assert.equal(formatStatusText(low), "$(zap) 900 ms");
  assert.equal(tooFewTokensPerForward(low), true);
  assert.equal(tooFewTokensPerForward({ tokens: 8, tokens_per_forward: 1.6 }), false);
  const empty = { latency_ms: 50, tokens: 0, tokens_per_forward: 0, cached: false };
  assert.equal(formatStatusText(empty), "$(zap) 50 ms");
  assert.equal(tooFewTokensPerForward(empty), false);
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

test("next edit stats: told apart from completions, latency and tokens per forward", () => {
  const stats = normalizeStats({
    feature: "inlineEdit",
    latencyMs: 412.4,
    tokens: 40,
    tokensPerForward: 3.64,
    targetForwards: 11,
    editCount: 2,
    copiedTokens: 36,
    rejected: null,
    regionLines: [3, 20],
  });
  assert.equal(isNextEditStats(stats), true);
  assert.equal(isNextEditStats(normalizeStats({ latencyMs: 3, tokens: 2 })), false);
  assert.equal(formatNextEdit(stats), "next edit · 412 ms · 3.6 tokens/forward");
  assert.equal(formatNextEdit(undefined), "next edit");
  assert.equal(
    formatNextEditDetails(stats),
    "412 ms: 2 edits, 40 tokens (36 copied from the region), 11 forwards of the model, 3.6 tokens/forward, region lines 4-20",
  );
  const refused = normalizeStats({ feature: "inlineEdit", latencyMs: 90, editCount: 0, rejected: "unclosed" });
  assert.equal(formatNextEditDetails(refused), "90 ms: 0 edits, refused: unclosed");
});

test("next edit stats of a rule: the rule and its confidence, not tokens per forward", () => {
  const rule = normalizeStats({
    feature: "inlineEdit",
    latencyMs: 38.2,
    tokens: 0,
    tokensPerForward: 0,
    targetForwards: 0,
    editCount: 1,
    rule: "rename",
    confidence: 0.9,
    candidates: 3,
    vetoed: { undo: 1, parse: 0 },
  });
  assert.equal(formatNextEdit(rule), "next edit · rename 0.90 · 38 ms");
  assert.equal(formatNextEditDetails(rule), "38 ms: 1 edit, rule rename 0.90, vetoed: undo 1, 0 tokens");
  const silent = normalizeStats({
    feature: "inlineEdit",
    latencyMs: 4,
    editCount: 0,
    tokens: 0,
    targetForwards: 0,
    tokensPerForward: 0,
    rule: null,
    abstained: "no rule candidate survived the vetoes",
  });
  assert.equal(formatNextEdit(silent), "next edit · 4 ms");
  assert.equal(formatNextEditDetails(silent), "4 ms: 0 edits, 0 tokens, no edit: no rule candidate survived the vetoes");
});
