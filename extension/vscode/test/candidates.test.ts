import { strict as assert } from "node:assert";
import { test } from "node:test";

import { CandidateCycle } from "../src/candidates";

test("one suggestion has no label; several start at the first", () => {
  const cycle = new CandidateCycle();
  assert.equal(cycle.label(), undefined);
  cycle.answered(["one()"]);
  assert.equal(cycle.label(), undefined);
  cycle.answered(["one()", "two()", "three()"]);
  assert.equal(cycle.label(), "1/3");
});

test("moves wrap around both ways, as VS Code's showNext / showPrevious do", () => {
  const cycle = new CandidateCycle();
  cycle.answered(["one()", "two()", "three()"]);
  cycle.moved(1);
  assert.equal(cycle.label(), "2/3");
  cycle.moved(1);
  cycle.moved(1);
  assert.equal(cycle.label(), "1/3");
  cycle.moved(-1);
  assert.equal(cycle.label(), "3/3");
});

test("a new list keeps the suggestion shown when it is still there, else the first", () => {
  const cycle = new CandidateCycle();
  // the automatic answer had one item; the explicit one (VS Code's Alt+]) has three, the same
  // first: VS Code moves from it
  cycle.answered(["one()"]);
  cycle.answered(["one()", "two()", "three()"]);
  cycle.moved(1);
  assert.equal(cycle.label(), "2/3");
  cycle.answered(["zero()", "one()", "two()"]);
  assert.equal(cycle.label(), "3/3");
  cycle.answered(["four()", "five()"]);
  assert.equal(cycle.label(), "1/2");
  cycle.clear();
  assert.equal(cycle.label(), undefined);
  cycle.moved(1); // nothing shown: nothing to move
  assert.equal(cycle.label(), undefined);
});
