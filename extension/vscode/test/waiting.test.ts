import { strict as assert } from "node:assert";
import { test } from "node:test";

import { WAIT_SHOWN_AFTER_MS, WaitingRequests } from "../src/waiting";
import { ManualTimers } from "./manualTimers";

function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void; reject: (e: unknown) => void } {
  let resolve!: (value: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

test("a request answered within a second is never shown as waiting", async () => {
  const timers = new ManualTimers();
  let changes = 0;
  const waiting = new WaitingRequests(() => (changes += 1), timers);
  const answer = deferred<string>();
  const tracked = waiting.track(answer.promise);
  timers.advance(WAIT_SHOWN_AFTER_MS - 1);
  answer.resolve("x");
  assert.equal(await tracked, "x");
  timers.advance(WAIT_SHOWN_AFTER_MS);
  assert.equal(waiting.active, false);
  assert.equal(changes, 0);
  assert.equal(timers.scheduled, 0);
});

test("a slow request is waiting from its second second until it settles, failed or not", async () => {
  const timers = new ManualTimers();
  let changes = 0;
  const waiting = new WaitingRequests(() => (changes += 1), timers);
  const first = deferred<string>();
  const second = deferred<string>();
  const one = waiting.track(first.promise);
  timers.advance(WAIT_SHOWN_AFTER_MS);
  assert.equal(waiting.active, true);
  assert.equal(changes, 1);
  const two = waiting.track(second.promise);
  timers.advance(WAIT_SHOWN_AFTER_MS);
  assert.equal(changes, 1); // still waiting: no news
  first.resolve("a");
  assert.equal(await one, "a");
  assert.equal(waiting.active, true); // the second still waits
  second.reject(new Error("cancelled"));
  await assert.rejects(two, /cancelled/);
  assert.equal(waiting.active, false);
  assert.equal(changes, 2);
});
