"""`quickdraft bench`: completion points sampled from a real repository, every strategy and peer
timed on them through `Completer` (prompts built exactly as `quickdraft serve` builds them).

- `holes`: sampling the completion points and the files open next to them;
- `session`: the one door into `Completer`;
- `peers`: transformers' assisted generation and prompt lookup, llama.cpp (optional);
- `variants`: strategy names on another runtime or layout (`hybrid@llamacpp`);
- `runner`: the interleaved loop, keystroke replay, draft-length sweep, incremental results;
- `report`: summary statistics, report.md and plots;
- `provenance`: the machine and build a results.json comes from (both benches);
- `cli`: the subcommand.

`--typing` replays typing sessions through a real `quickdraft serve` over stdio LSP:

- `typing_plan`: the keystrokes that type a hole, and whether a suggestion agrees with them;
- `editor`: the editor's copy of a document and the LSP params VS Code sends;
- `lsp_client`: the stdio JSON-RPC client;
- `typing_server`: one server process per variant, initialized as VS Code does;
- `typing_replay`: the replay of every hole on every variant, and its records;
- `typing_report`: its summary, report.md and plot;
- `typing_cli`: its arguments and the run;
- `workspace`, `workspace_replay`, `workspace_report`: `--typing-scenario workspace`, files
  opened together and visited (didFocus), planned, sent and reported.

`--edits` asks a real `quickdraft serve` for next edits (`textDocument/copilotInlineEdit`):

- `edits`: next-edit pairs mined from a repository's git history;
- `edits_replay`: one server per strategy, every pair sent as an editor sends it, the run;
- `edits_report`: scoring against the next hunk, the summary and report.md.
"""
