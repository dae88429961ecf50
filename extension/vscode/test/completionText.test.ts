import { strict as assert } from "node:assert";
import { test } from "node:test";

import { cleanInsertTexts, withoutControlCharacters } from "../src/completionText";

test("control characters other than tab and newline are removed", () => {
  assert.equal(withoutControlCharacters("a\u0011b\u0000c\u001bd\u007fe\u0085f"), "abcdef");
  assert.equal(withoutControlCharacters("if x:\n\treturn 1\n"), "if x:\n\treturn 1\n");
  assert.equal(withoutControlCharacters("one\r\ntwo\rthree"), "one\ntwothree");
  // printable characters stay, including the control pictures and non-ASCII text
  assert.equal(withoutControlCharacters("\u2411 é ü 中 \u00a0"), "\u2411 é ü 中 \u00a0");
});

test("items keep their class; those left with nothing to insert are dropped", () => {
  class Snippet {
    constructor(public value: string) {}
  }
  const snippet = new Snippet("x\u0011 = ${1:y}");
  const items = [
    { insertText: "total\u0011 = 1", range: "r1" },
    { insertText: "\u0011\u0012" },
    { insertText: snippet as { value: string } },
    { insertText: "" },
  ];
  const kept = cleanInsertTexts(items);
  assert.deepEqual(
    kept.map((item) => item.insertText),
    ["total = 1", snippet, ""],
  );
  assert.equal(snippet.value, "x = ${1:y}");
  assert.ok(kept[1].insertText instanceof Snippet);
  assert.equal((kept[0] as { range?: string }).range, "r1");
});
