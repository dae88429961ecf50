import { strict as assert } from "node:assert";
import { test } from "node:test";

import { DEFAULT_DEBOUNCE_MS, debounceMs, MAX_DEBOUNCE_MS, objectReader } from "../src/config";
import { CancellationLike, debounced, DebounceCounts, quietPeriod } from "../src/debounce";

/** A cancellation token as VS Code hands one to an inline completion provider. */
class FakeToken implements CancellationLike {
  isCancellationRequested = false;
  private listeners = new Set<() => unknown>();

  onCancellationRequested(listener: () => unknown): { dispose(): void } {
    this.listeners.add(listener);
    return { dispose: () => this.listeners.delete(listener) };
  }

  cancel(): void {
    this.isCancellationRequested = true;
    for (const listener of [...this.listeners]) {
      listener();
    }
  }

  get listening(): number {
    return this.listeners.size;
  }
}

/** Lets resolved promises run their continuations (setImmediate is not mocked). */
const settle = () => new Promise((resolve) => setImmediate(resolve));

test("an automatic request is sent only after the quiet period", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const token = new FakeToken();
  const sent: string[] = [];
  const counts = new DebounceCounts();
  const answer = debounced(true, 150, token, () => (sent.push("req"), "items"), counts);
  t.mock.timers.tick(149);
  await settle();
  assert.deepEqual(sent, []);
  t.mock.timers.tick(1);
  assert.equal(await answer, "items");
  assert.deepEqual(sent, ["req"]);
  assert.equal(counts.sent, 1);
  assert.equal(counts.dropped, 0);
  assert.equal(token.listening, 0, "the cancellation listener is removed");
});

test("a request whose token fires during the wait is never sent", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  const token = new FakeToken();
  let sends = 0;
  const counts = new DebounceCounts();
  const answer = debounced(true, 150, token, () => ++sends, counts);
  t.mock.timers.tick(100);
  token.cancel();
  assert.equal(await answer, undefined);
  t.mock.timers.tick(1000);
  await settle();
  assert.equal(sends, 0);
  assert.equal(counts.dropped, 1);
  assert.equal(token.listening, 0);
});

test("a typing burst sends only its last request", async (t) => {
  t.mock.timers.enable({ apis: ["setTimeout"] });
  // VS Code asks again on every keystroke and cancels the previous request's token.
  const sent: number[] = [];
  const counts = new DebounceCounts();
  const answers: Promise<number | undefined>[] = [];
  let previous: FakeToken | undefined;
  for (let key = 0; key < 5; key++) {
    previous?.cancel();
    const token = new FakeToken();
    answers.push(debounced(true, 150, token, () => (sent.push(key), key), counts));
    previous = token;
    t.mock.timers.tick(60); // faster than the quiet period
  }
  t.mock.timers.tick(150);
  assert.deepEqual(await Promise.all(answers), [undefined, undefined, undefined, undefined, 4]);
  assert.deepEqual(sent, [4]);
  assert.equal(counts.sent, 1);
  assert.equal(counts.dropped, 4);
});

test("an invoked request goes at once; a cancelled one never", async () => {
  // no mocked timers: nothing may wait here
  const token = new FakeToken();
  assert.equal(await debounced(false, 10_000, token, () => "now"), "now");
  const cancelled = new FakeToken();
  cancelled.cancel();
  let sends = 0;
  assert.equal(await debounced(false, 0, cancelled, () => ++sends), undefined);
  assert.equal(await debounced(true, 0, cancelled, () => ++sends), undefined);
  assert.equal(await debounced(true, 150, cancelled, () => ++sends), undefined);
  assert.equal(sends, 0);
});

test("a quiet period of 0 sends an automatic request at once", async () => {
  assert.equal(await quietPeriod(0, new FakeToken()), true);
  assert.equal(await debounced(true, 0, new FakeToken(), () => 7), 7);
});

test("a token that fires while its listener is registered ends the wait", async () => {
  const token = new FakeToken();
  token.onCancellationRequested = (listener) => {
    token.isCancellationRequested = true;
    listener();
    return { dispose: () => undefined };
  };
  assert.equal(await quietPeriod(10_000, token), false);
});

test("quickdraft.debounceMs: default, whole milliseconds, bounded", () => {
  assert.equal(DEFAULT_DEBOUNCE_MS >= 75 && DEFAULT_DEBOUNCE_MS <= 350, true);
  assert.equal(debounceMs(objectReader({})), DEFAULT_DEBOUNCE_MS);
  assert.equal(debounceMs(objectReader({ debounceMs: null })), DEFAULT_DEBOUNCE_MS);
  assert.equal(debounceMs(objectReader({ debounceMs: "fast" })), DEFAULT_DEBOUNCE_MS);
  assert.equal(debounceMs(objectReader({ debounceMs: Number.NaN })), DEFAULT_DEBOUNCE_MS);
  assert.equal(debounceMs(objectReader({ debounceMs: 0 })), 0);
  assert.equal(debounceMs(objectReader({ debounceMs: 99.6 })), 100);
  assert.equal(debounceMs(objectReader({ debounceMs: -5 })), 0);
  assert.equal(debounceMs(objectReader({ debounceMs: 1e9 })), MAX_DEBOUNCE_MS);
});
