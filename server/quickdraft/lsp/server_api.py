"""The server as the parts it is composed of see it: `ServerApi`.

`QuickdraftServer` (server.py) builds its parts (the completion and next-edit services, the
work ahead, the model loading, the status) and hands each itself; they use only what this
protocol names, so none of them imports server.py, which imports them all.
"""

from __future__ import annotations

from typing import Protocol

from lsprotocol import types
from pygls.progress import Progress
from pygls.protocol import LanguageServerProtocol

from quickdraft.lsp.configuration import ConfigurationManager
from quickdraft.lsp.documents import DocumentStore
from quickdraft.lsp.worker import Loaded, ModelHost, ModelWorker


class ServerApi(Protocol):
    """What a part of the server may use: the state the event loop owns (the documents, the
    configuration), the worker and what it owns, and the ways to the client."""

    config: ConfigurationManager
    documents: DocumentStore
    worker: ModelWorker
    host: ModelHost
    """Owned by the worker: submit its methods to `worker`, never read it here."""
    serving: Loaded | None
    """The models serving, as their load told the event loop (None: none loaded yet)."""

    @property
    def works_ahead(self) -> bool:
        """Whether models serve and work ahead pays with them (`Loaded.works_ahead`)."""

    @property
    def protocol(self) -> LanguageServerProtocol: ...

    @property
    def client_capabilities(self) -> types.ClientCapabilities: ...

    @property
    def work_done_progress(self) -> Progress: ...

    def log(self, message: str, level: str = "info") -> None:
        """`window/logMessage` and the Python log, both at `level`."""

    def show(self, message: str, level: str = "error") -> None:
        """`window/showMessage` (and the Python log, at `level`)."""
