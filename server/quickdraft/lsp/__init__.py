"""The language server: `quickdraft serve`.

`server.py` (the pygls server and its protocol fixes), `handlers/` (one module per LSP
feature), `documents.py` (open documents, UTF-16 positions), `configuration.py` (client
settings over CLI defaults), `worker.py` (the thread that owns the models), `service.py`
(completion requests, typed-ahead answers, stats).
"""
