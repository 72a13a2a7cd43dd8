"""layerflow engine: BPMN processes on SpiffWorkflow with a governed context per activity.

``load_process`` parses and validates a process; ``Engine`` starts, runs, resumes and
persists its instances. Handlers are registered with ``@activity("name")``.
"""

from .handlers import ActivityContext, BpmnError, HandlerRegistry, activity
from .knowledge import BM25Retriever, Hit, Retriever
from .process import Process, load_process
from .runtime import AnswerWriteDenied, Engine, Instance, TimedOut
from .store import InstanceRecords, Store, open_store

__all__ = [
    "ActivityContext",
    "AnswerWriteDenied",
    "BM25Retriever",
    "BpmnError",
    "Engine",
    "FormAnswerInvalid",
    "GovernanceService",
    "HandlerRegistry",
    "Hit",
    "Instance",
    "InstanceRecords",
    "Process",
    "Retriever",
    "StartDataInvalid",
    "Store",
    "TimedOut",
    "activity",
    "create_app",
    "load_process",
    "open_store",
]


def __getattr__(name: str) -> object:
    # FastAPI is imported only by what serves HTTP: `layerflow run` stays fast
    if name == "create_app":
        from .api import create_app

        return create_app
    if name == "FormAnswerInvalid":
        from .governance import FormAnswerInvalid

        return FormAnswerInvalid
    if name == "StartDataInvalid":
        from .governance import StartDataInvalid

        return StartDataInvalid
    if name == "GovernanceService":
        from .governance import GovernanceService

        return GovernanceService
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
