"""`quickdraft bench`: completion points sampled from a real repository, every strategy and peer
timed on them through `Completer` (prompts built exactly as `quickdraft serve` builds them).

- `holes`: sampling the completion points and the files open next to them;
- `session`: the one door into `Completer`;
- `peers`: transformers' assisted generation and prompt lookup, llama.cpp (optional);
- `runner`: the interleaved loop, keystroke replay, draft-length sweep, incremental results;
- `report`: summary statistics, report.md and plots;
- `cli`: the subcommand.
"""
