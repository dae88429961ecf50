"""The language server: `quickdraft serve`.

`assembly.py` (`create_server`: the server with every handler registered), `server.py` (the
pygls server, its protocol fixes, document sync), `handlers/` (one module per LSP feature),
`server_api.py` (the server as its parts see it), `documents.py` (open documents, UTF-16
positions), `configuration.py` (client settings over CLI defaults), `worker.py` (the thread that
owns the models), `service.py` (completion requests, stats; next edits), `typed_ahead.py`
(answers from work done before), `work_ahead.py` (warm-up and prefetch), `model_loading.py`
(loading the models, and the revert when a reload fails), `status.py` (the state the editor
is told).
"""
