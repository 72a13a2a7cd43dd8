"""``validate_process``: every problem of a BPMN process and its config, reported at once.

Nothing runs on a process that does not validate: the engine calls
``raise_for_problems(validate_process(...))`` before it starts an instance, and
``layerflow validate`` prints ``format_report(report)``.

Checks, each with a stable ``code`` (``Problem.code``); ``W`` marks warnings, which do
not make ``report.ok`` false:

====================================  ====================================================
``bpmn_file_not_found``               a BPMN path that cannot be read
``xml_malformed``                     not well-formed XML (file, line, column from lxml; an undeclared
                                      prefix names its element and the declaration to add)
``bpmn_namespace``                    root is not ``{BPMN 2.0 MODEL}definitions``
``duplicate_id``                      two elements of one file share an id, or two files define one process id
``no_executable_process``             no ``bpmn:process`` that SpiffWorkflow would run
``process_not_found``                 ``process_id`` (argument or ``process:`` in the config) absent
``process_not_executable``            the chosen process has ``isExecutable`` other than "true"
``process_ambiguous``                 several executable processes no other one calls, and no process id (unless
                                      a collaboration draws them as pools that exchange messages: it runs)
``process_executable_unset`` W        the chosen process has no ``isExecutable``
``collaboration_not_executable``      the collaboration to run has no pool whose process is executable
``message_flow_mismatch``             a message flow between two running pools whose ends send and wait for
                                      different messages (SpiffWorkflow routes by the message's name)
``message_flow_sends_nothing``        a message flow between running pools that starts at no message throw
                                      event, end event or send task (or at a pool's border)
``message_flow_receives_nothing``     ... that ends at no message catch (or at a pool where nothing waits for it)
``message_flow_not_run`` W            a message flow to a pool layerflow does not run (not executable, black box)
``message_flow_from_outside`` W       a message flow from such a pool: the instance waits until it is sent
``signal_to_other_process`` W         a signal the process run alone throws that only another process of the
                                      files catches: no signal goes from one instance to another
``signal_from_other_process`` W       a signal start or catch event of the process run alone whose signal only
                                      another process throws: it waits until the signal is sent to it
``collaboration_never_starts``        every executable pool of the collaboration starts with a message start event
``pool_event_subprocess_never_starts`` W  a message or signal event sub-process in a pool's process (it runs as a
                                      called process: SpiffWorkflow starts those at the top level only)
``collaboration_correlation``         correlation keys or properties in the collaboration to run: one instance
                                      is one conversation, messages between its pools are not correlated
``correlation_message_missing``       a correlation property's retrieval expression with no messageRef
                                      (SpiffWorkflow cannot load the file)
``script_unknown_function`` W         a script calls a name it does not define and Python has no builtin of
                                      (SpiffArena's backend scripts), or a function of a module it does not
                                      import (``datetime.datetime.utcnow()``): the run stops there with a NameError
``unknown_element_id``                config for an id that is no element of the loaded processes
``config_not_a_flow_node``            config for a sequence flow, process, ... (not a task/event/gateway)
``config_misplaced``                  ``layerflow:config`` outside ``bpmn:extensionElements``
``config_namespace`` W                a ``config``/``activityConfig`` element in another namespace
``invalid_config_json``               an extension element's text is not JSON (line inside it)
``invalid_config_field``              ActivityExtensionConfig rejects a field (file, id, field)
``config_merge_invalid``              BPMN extension + config file entry are invalid together
``branches_on_non_gateway``           ``branches`` on an element that is not a gateway
``handler_not_run``                   a ``handler`` or ``llm:`` block for a send or receive task, call activity
                                      or sub-process: only a task that does the work itself runs one
``branch_not_outgoing``               a ``branches`` id that no outgoing flow of the gateway targets
``branch_priority_unknown_id``        a ``branchPriority`` id that is no element of the process
``branch_priority_not_a_branch`` W    a ``branchPriority`` id that no split's outgoing flow leads to
                                      (the join never meets it among its branches)
``branch_priority_unused`` W          a ``branchPriority`` with a ``mergeStrategy`` other than
                                      ``BRANCH_PRIORITY``: no other strategy reads it
``join_config_on_non_join`` W         join settings (``mergeStrategy`` other than the default,
                                      ``branchPriority``, ``reducers``, ``conflictPolicy``) on a
                                      task, an event or a gateway that only splits: the engine
                                      reads them at a join only (and on a parallel multi-instance
                                      sub-process or call activity, whose instances meet as branches)
``scope_config_not_read`` W           compression settings (without a pre- or postScript) or ``knowledgeConfig``
                                      on a sub-process or call activity: its steps follow their own configs
``config_id_mismatch`` W              ``activityId`` / ``gatewayId`` inside a config names another
                                      element than the one it is keyed by (or attached to)
``config_type_mismatch`` W            the seed's ``type`` (``XOR_SPLIT``, ``AND_JOIN``, ...) inside a config
                                      says another kind of gateway, or a split where the element joins
                                      (or the other way round), than the BPMN draws
``knowledge_query_template`` W        a ``knowledgeConfig.query`` that is no template of context keys (an
                                      unclosed brace, attribute or index access): it is sent as written
``knowledge_collection_not_found`` W  a ``ragCollections`` name with no ``knowledge/<name>/``
                                      folder of .md/.txt files beside the process (the default
                                      retriever finds nothing; a custom retriever may serve it)
``flow_ref_unknown``                  a sequence flow's sourceRef/targetRef names no element of its scope
                                      (W when it has no sourceRef: nothing takes it, SpiffWorkflow runs without it)
``flow_id_missing``                   a sequence flow with no id (BPMN allows it): SpiffWorkflow keys flows by
                                      id and follows none of them, so the instance would skip every element
                                      after it and complete
``boundary_on_event_subprocess``       a boundary event attached to an event sub-process (Flowable runs one):
                                      SpiffWorkflow cannot load it
``node_id_missing``                   a task, event, gateway or (event) sub-process with no id: SpiffWorkflow keys
                                      every element by id, and starting the process fails in its serializer
``data_ref_unknown``                  a data association's sourceRef/targetRef names no data object or data
                                      store reference of the file (or one whose dataObjectRef names no dataObject)
``call_activity_unknown_process``     a callActivity's calledElement is no process of the files given, or
                                      one whose isExecutable is not "true" (SpiffWorkflow runs none of those)
``call_activity_recursion``           call activities that call their own process back on every path (no
                                      gateway, loop or boundary event before any of them): the calls
                                      never end, and the run would hang starting new instances
``gateway_default_invalid``           ``default=`` names a flow that does not leave the gateway
``gateway_flow_without_condition``    a non-default outgoing flow of an XOR or inclusive gateway has no condition
``join_never_complete`` W             a parallel join whose incoming flows come from different paths of one
                                      exclusive or event-based gateway: it waits for ever
``gateway_coverage_gap``              XOR without default: numeric conditions leave values uncovered (a
                                      warning when no natural number is left out, and for an inclusive gateway)
``gateway_not_exhaustive``            (warning) XOR without default: conditions test a finite set of values
``condition_syntax``                  a condition expression (a flow's, a conditional event's, a loop's
                                      cardinality or completion condition, a correlation property's
                                      retrieval expression, a message's ``spiffworkflow:messagePayload``, an
                                      event's ``payloadExpression``) is not valid Python; one
                                      written for Camunda (JUEL ``${...}``, FEEL ``=...``) says what to write
``policy_key_never_written`` W        a join's ``conflictPolicy`` rule or ranking for a key nothing in the
                                      process writes (a misspelt key: the nearest known one is named)
``preserve_key_never_written`` W     a ``preserveKeys`` entry for a key nothing in the process writes, close to
                                      one it does (a misspelt key, the nearest named: it keeps nothing, and
                                      the key it was meant for is folded)
``policy_rule_expression``            a join's ``conflictPolicy`` rule whose ``when`` is no expression the
                                      policy can evaluate (a syntax error, a call or name outside the safe
                                      subset): the join would stop the instance with it
``condition_probability``             a condition of an exclusive or inclusive gateway's flow that is a bare number
                                      (a simulation tool's branch probability, Signavio's export): always true
``condition_literal_name`` W          a condition reads ``true``, ``false``, ``null`` (another expression
                                      language's literals) as a context key
``error_end_uncaught`` W              an error end event at the top level of the process that runs that no
                                      error event sub-process of the process catches: nothing catches it,
                                      and the instance ends as completed
``condition_camunda_api``              a condition calls Camunda's process API (``execution.getVariable("x")``,
                                      a JavaScript or Groovy condition's habit) or Imixs-Workflow's
                                      (``workitem.getItemValueDouble("x")``): the message writes the Python
                                      (a script that calls it, in any scriptFormat: ``script_syntax`` /
                                      ``script_language``, with the assignments to write)
``condition_javascript_api``           a condition reaches the variables as a JavaScript engine does
                                      (bpmn-engine's ``this.environment.variables.x``, ``environment.output.x``):
                                      the message writes the Python (a script that does, or calls ``next()`` or
                                      ``console.log``: ``script_language`` / ``script_syntax``)
``condition_attribute_read``           a condition reads an object's field by path (``order.weight``, as FEEL
                                      and JUEL do): context values are JSON; the message writes the keys
                                      (``order['weight']``)
``condition_camunda_variable`` W      a condition reads Camunda's multi-instance counters (``nrOfInstances``,
                                      ``nrOfCompletedInstances``, ``loopCounter``), which SpiffWorkflow never sets
``condition_unknown_function`` W      a condition calls a function that is no Python builtin (FEEL's
                                      ``count()``, ``contains()``), or one of a module (``datetime.date.today()``,
                                      which no expression is given): context values are never callable
``timer_expression``                  a timer's timeDuration / timeDate / timeCycle is not a Python
                                      expression, or is ISO 8601 text not quoted (``PT1S``, not ``"PT1S"``),
                                      or is quoted text that is no ISO 8601 duration / date / repeating interval,
                                      or calls another language's date API (``DateTime.AddDays(...)``)
``script_language``                   a scriptTask whose scriptFormat is not Python and whose script is not
                                      Python (a warning when it parses as Python: it runs as Python), or one
                                      that calls Java's System.out or jBPM's kcontext, or uses a JavaScript
                                      engine's runtime (``next()``, ``this.environment``; the message writes the
                                      Python; in a Python script too: ``script_syntax``)
``reserved_id``                       an element id SpiffWorkflow gives its own tasks (``Start``, ``End``,
                                      ``<process>.EndJoin``): the element is lost or replaces that task
``implicit_split``                    a task or event (no gateway, no start event) with several outgoing
                                      flows: SpiffWorkflow cannot load it
``branches_ignored`` W                ``branches`` on a gateway with one outgoing flow: nothing splits there
``condition_ignored`` W               a conditionExpression on a flow that leaves no exclusive or inclusive
                                      gateway: it is never evaluated, the flow is always taken
``no_outgoing_flow`` W                an activity, intermediate event or gateway with no outgoing flow: its
                                      path ends there, and in a branch of a split its writes are dropped
``unreachable`` W                     a flow node with no incoming flow that no event starts (a link catch event
                                      that no link throw event of its level jumps to): it never runs
``cancel_outside_transaction``        a cancel boundary event attached to anything but a bpmn:transaction
``compensation_unsupported``          a compensation boundary, throw or end event: SpiffWorkflow 3.2 runs no
                                      compensation (it cannot load the boundary event; it reads the throw as a
                                      plain event, so the undo never runs)
``token_quantity`` W                 an activity's startQuantity / completionQuantity other than 1 (the tokens it
                                      waits for, or sends down each outgoing flow): SpiffWorkflow ignores both,
                                      and runs the step once per arriving token
``split_branches_merged`` W           branches of one split meet (exclusive gateway, task) before their join,
                                      which then fires before every branch has arrived
``join_reentered_in_loop`` W          a loop that goes back into the branches between a parallel split and its
                                      join from after the join (a second split, a flow into one branch) without
                                      passing the split: the join cannot pair its tokens with one split, and the
                                      run stops there (or fires it short) after running the wrong steps
``no_start_event``                    a process or sub-process with no start event (one that a receive task
                                      with instantiate="true" starts: the message start event to write)
``start_event_never_runs`` W          a second start event in a scope that has a start event with no trigger:
                                      SpiffWorkflow starts there and cancels the others, whose paths never run
``unsupported_start_event``           a start event of an event sub-process with a trigger other than a
                                      message, signal, timer, condition, error or escalation (a compensation
                                      one): SpiffWorkflow 3.2 reads none of them, and would start the event
                                      sub-process at once, without the event (error and escalation starts run:
                                      ``spiff._LayerflowProcessParser.add_tasks``)
``error_start_non_interrupting`` W    an error start event of an event sub-process with ``isInterrupting="false"``:
                                      an error always interrupts its scope, and so it runs
``event_subprocess_never_starts``     an event sub-process with a message or signal start inside a sub-process:
                                      SpiffWorkflow 3.2 starts those at the top level of the process only
``called_event_subprocess_never_starts`` W  a process the one to run calls (a call activity) has an event
                                      sub-process with a message or signal start: SpiffWorkflow 3.2 starts
                                      those in the top-level process only, never in a called one
``event_subprocess_after_interrupt`` W an interrupting event sub-process throws a message or signal that
                                      would start an event sub-process of the same process: it starts
                                      nothing there, the process being interrupted (likely not what was meant)
``no_implementation`` W               a script task without a script, a service task without a
                                      spiffworkflow:serviceTaskOperator (one whose operationRef names a
                                      bpmn:operation: the message names it), and no handler or llm in the config
``llm_without_handler`` W             a task whose llm: block names no model and whose config gives no
                                      handler: it runs only with a model (--model), offline it stops there
``invalid_form``                      a user task's form: a camunda:formField with no id, of an unknown type,
                                      an enum with no values, a default or constraint that does not fit; a
                                      SpiffArena formJsonSchemaFilename file that is not JSON or no JSON Schema;
                                      a camunda-forms:bpmn: formKey with no zeebe:userTaskForm in the file
``form_schema_missing`` W             a SpiffArena formJsonSchemaFilename file that is not beside the BPMN,
                                      a Camunda 8 formId with no .form file beside it, a form-js form that
                                      is not JSON, a component of an unknown type: the task runs, those
                                      answers unchecked against a form
``business_rule_without_dmn``         a businessRuleTask that names no DMN decision (and has no handler), or
                                      one whose decision no DMN file given or beside the process defines
``dmn_namespace``                     a DMN file whose root is no DMN 1.1-1.3 ``definitions``
``dmn_unsupported``                   a DMN file with no decision, with several (SpiffWorkflow 3.2 reads the
                                      first only), a decision without exactly one decision table, a hit
                                      policy other than UNIQUE and COLLECT, or an entry that is FEEL, not the
                                      Python SpiffWorkflow's DMN engine runs (a range, ``not(...)``)
``dmn_invalid``                       SpiffWorkflow's DMN parser refuses the file
``dmn_result_mapping``                a businessRuleTask's camunda:mapDecisionResult that is none of
                                      resultList, singleResult, singleEntry, collectEntries
``dmn_result_variable``               a businessRuleTask's result variable that the config's system: fixes
                                      in L0 SYSTEM, which no activity may write
``unsupported_element``               a complexGateway, which SpiffWorkflow has no support for, or an
                                      adHocSubProcess, which SpiffWorkflow 3.2 cannot run to its end
``link_unmatched``                    a link throw event whose link no link catch event of its process level
                                      (process or sub-process) catches: its path would end there
``link_duplicate``                    two link catch events of one name in one process level
``link_name_missing``                 a link throw or catch event whose linkEventDefinition has no name (and no
                                      ``bpmn:target`` / ``bpmn:source`` that pairs it)
``link_flow``                         a sequence flow out of a link throw event or into a link catch event:
                                      BPMN forbids a link event to be both target and source of flows
``link_misplaced``                    a linkEventDefinition on a start, end or boundary event
``boundary_never_thrown`` W           an error or escalation boundary event on a user or manual task (a bpmn:task)
                                      that nothing there throws: a person's answer throws nothing (Camunda's task
                                      forms do), an error only from a pre- or postScript raising BpmnError, an
                                      escalation never; the message says what to write (the postScript, a gateway)
``boundary_catch_twice``              two error (or escalation) boundary events of one activity that catch the
                                      same code (or both any): both fire, and the path after each runs
``event_definition_misplaced``        an event definition BPMN does not allow on its kind of event (a timer on
                                      a throw event, a terminate on a catch event, ...): SpiffWorkflow
                                      ignores it and goes straight on
``foreign_extension`` W               another engine's execution settings (camunda:class,
                                      camunda:resultVariable, zeebe:taskDefinition, ...), which no one runs;
                                      a conditional event's camunda:variableName / variableEvents filter
``event_without_ref`` W               a message or signal catch event (start, intermediate, boundary) that names
                                      no bpmn:message / bpmn:signal: it fires only on one named like the event
                                      (SpiffWorkflow's fallback), and never when the event has no name
``waits_for_nothing`` W             a receive task that names no message, an intermediate catch event with no
                                      event definition: SpiffWorkflow gives it nothing to wait for, so the path
                                      goes straight on (as a state machine's "action" of Imixs, fbpmn's models)
``escalation_without_code`` W         a bpmn:escalation with no escalationCode that a throw event (intermediate
                                      or end) names: every catch naming such an escalation catches it, as does
                                      every catch-all (no escalationRef)
``event_extension_misplaced``         a spiffworkflow:payloadExpression / variableName on a signal, error or
                                      escalation event definition: SpiffWorkflow reads them from the
                                      bpmn:signal (error, escalation) only, so they are never read
``condition_name_never_set`` W       a conditional event (intermediate, boundary, the start of an event
                                      sub-process; not a process's own start, fed by the start data) whose
                                      condition reads a name nothing in the files sets (no
                                      script, form field, mapping, config, decision or payload variable names it):
                                      it waits until the name is given from outside (--data, a message's payload,
                                      ``resume --set``, REST inject), else for ever (a warning: that data may come
                                      from outside)
``conditional_branch_never_fires`` W  a conditional intermediate catch event that is a branch of an event-based
                                      gateway: SpiffWorkflow 3.2 never evaluates its condition, so it never fires
                                      (the gateway's other branches still decide); the message says what to model
``cycle_branch_never_fires`` W        a timer intermediate catch event with a timeCycle that is a branch of an
                                      event-based gateway: SpiffWorkflow 3.2 never starts it, so it never fires
                                      (the other branches still decide); the message says what to model instead
``message_extension_deprecated`` W   a spiffworkflow:messagePayload / messageVariable on a bpmn:message: SpiffWorkflow
                                      3.2 reads it but emits a DeprecationWarning; the warning names the events
                                      (messageEventDefinitions) to move each into
``message_extension_misplaced``       a spiffworkflow:messagePayload / messageVariable in a message event's own
                                      extensionElements: SpiffWorkflow reads them from its
                                      bpmn:messageEventDefinition only, so the payload goes out empty / the
                                      variable is never set (the payload's keys are written one by one)
``message_extension_shadowed``        a spiffworkflow:messagePayload / messageVariable of an event (or send / receive
                                      task) whose bpmn:message has one of its own: SpiffWorkflow then reads the
                                      message's only, and the event's is lost (an empty payload, a variable never set)
``event_ref_unknown``                 a messageRef / signalRef / errorRef / escalationRef (of an event definition,
                                      a send or receive task) that names no such element of the file:
                                      SpiffWorkflow fails to load it with an error of its own parser
``boundary_not_attached``             a boundary event whose attachedToRef names no activity of the process, or
                                      one drawn outside its activity's scope: SpiffWorkflow drops it without a
                                      word, and its path never runs
``call_mapping_expression``           a call activity's camunda:in / camunda:out (operaton:, activiti:,
                                      flowable:) whose sourceExpression computes something (a JUEL
                                      expression): nothing evaluates it, the target is never set
                                      (a mapping from one variable to another runs)
``call_mapping_system``               a call activity's camunda:in / camunda:out whose target is a key the
                                      config's system: fixes (L0 SYSTEM): the mapping's write is denied and
                                      the instance stops at the call activity
``io_mapping_system``                 a task's or event's camunda:inputOutput / zeebe:ioMapping (operaton:) mapping
                                      that runs and whose target is a key the config's system: fixes (L0 SYSTEM):
                                      its write is denied and the instance stops at that element
``io_mapping_on_event``               an event's input mapping (a throw event's), or an output mapping that computes
                                      something: never run, the target is never set; error where the files read it
                                      (a condition, a script, another mapping), else a warning
``caught_variable_not_set``           a catch event's camunda:errorCodeVariable / errorMessageVariable /
                                      escalationCodeVariable (operaton:; flowable:errorVariableName) that
                                      nothing sets: the event names no error (escalation) with a code, which
                                      is known only as it catches, or the message is an expression; error
                                      where the files read it, else a warning (with a code, they are set as
                                      the event catches)
``io_mapping_expression``             an activity's camunda:inputOutput / zeebe:ioMapping (operaton:) mapping that
                                      computes something (or a script, a target path): nothing evaluates it, the
                                      target is never set; error where the files read the target, else a warning
                                      (a variable, a path into an object or a literal runs)
``multi_instance_foreign_collection``  a multi-instance activity whose collection is another engine's attribute
                                      (camunda:collection) and which has no loopDataInputRef or loopCardinality:
                                      SpiffWorkflow cannot load it; the message writes the BPMN to use
``loop_without_gateway``              a loop of sequence flows through no exclusive, inclusive or event-based
                                      gateway: SpiffWorkflow cannot start an instance (RecursionError)
``data_input_assignment``             a task's dataInput given its value by a bpmn:assignment (jBPM's task
                                      parameters): SpiffWorkflow runs none, the input is never set (a
                                      warning when no bpmn:inputSet lists it: the task runs without it)
``data_object_named_apart``           a script task sets the name of a data object its dataOutputAssociation
                                      writes, not its id (a modeler's generated id): SpiffWorkflow keys it by id
                                      (a warning for a user, service or manual task, whose work may set the id)
``data_item_named_apart`` W           a multi-instance inputDataItem / outputDataItem, or a task's dataInput /
                                      dataOutput, whose name is not its id: SpiffWorkflow names the
                                      variable by its id
``condition_natural_language`` W      an XOR flow's condition is a sentence: the model decides it
``script_syntax``                     a script (scriptTask, pre/postScript) is not valid Python
``spiff_validation``                  SpiffWorkflow's own parser rejects the process
``data_store_unsupported``            a bpmn:dataStore (with a name or without), or a data association of a
                                      task that reads or writes a bpmn:dataStoreReference (as modelers draw
                                      a data store): SpiffWorkflow needs a class registered for its name,
                                      and layerflow registers none
``handler_not_found``                 ``handler: file.py:function`` whose file or function is absent, or
                                      ``module:function`` whose module cannot be found (not run)
``config_*``                          problems of the config file itself (``engine.configfile``);
                                      ``config_ambiguous`` W: several config files beside the BPMN
``bpmn_schema`` W                     the file does not conform to the BPMN 2.0 XSD
====================================  ====================================================

The exclusive-gateway coverage check (``gateway_coverage_gap``, ``gateway_not_exhaustive``)
is ``gateways.coverage.coverage_gap``; its docstring says what it judges and what it leaves.

Conditions are checked stripped and scripts exactly as written, because that is how the
engine runs them: an indented script fails with "unexpected indent" and is reported.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import fnmatch
import functools
import importlib
import json
import re
import shlex
import textwrap
import threading
from datetime import datetime, timezone
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from lxml import etree
from pydantic import ValidationError

from context_layers.config import ActivityExtensionConfig, config_from_dict
from context_layers.context import BRANCH_MARKERS
from context_layers.errors import ConfigError, LayerflowError, ProcessError
from gateways.conditions import FOREIGN_LITERALS, expression_dialect, is_flow_sentence, python_source
from gateways.coverage import coverage_gap

from . import call_mappings, dmn, io_mappings, links
from .configfile import (RESERVED_KEYS, Problem, ProcessConfigFile, called_process_configs, configs_beside,
                         load_config_file, main_file_first)
from .handlers import REGISTRY

__all__ = [
    "BPMN_NS",
    "LAYERFLOW_NS",
    "SPIFF_NS",
    "Problem",
    "ValidationReport",
    "format_report",
    "raise_for_problems",
    "read_extension_configs",
    "validate_process",
]

BPMN_NS = "http://www.omg.org/spec/BPMN/20100524/MODEL"
SPIFF_NS = "http://spiffworkflow.org/bpmn/schema/1.0/core"
LAYERFLOW_NS = "https://layerflow.dev/bpmn"

_LF_CONFIG = f"{{{LAYERFLOW_NS}}}config"
_SPIFF_CONFIG = f"{{{SPIFF_NS}}}activityConfig"
_CONFIG_TAGS = (_SPIFF_CONFIG, _LF_CONFIG)  # merge order: the own namespace wins


def _bpmn(tag: str) -> str:
    return f"{{{BPMN_NS}}}{tag}"


_SEQUENCE_FLOW = _bpmn("sequenceFlow")

# Elements that become task specs: the only ones the engine hands a config to.
_FLOW_NODES = frozenset(_bpmn(t) for t in (
    "task", "userTask", "manualTask", "scriptTask", "serviceTask", "sendTask", "receiveTask",
    "businessRuleTask", "callActivity", "subProcess", "transaction", "adHocSubProcess",
    "startEvent", "endEvent", "intermediateCatchEvent", "intermediateThrowEvent", "boundaryEvent",
    "exclusiveGateway", "parallelGateway", "inclusiveGateway", "eventBasedGateway", "complexGateway",
))
_NOT_ACTIVITIES = frozenset(_bpmn(t) for t in (
    "startEvent", "endEvent", "intermediateCatchEvent", "intermediateThrowEvent", "boundaryEvent",
    "exclusiveGateway", "parallelGateway", "inclusiveGateway", "eventBasedGateway", "complexGateway",
))
_EVENT_REFS = (("messageEventDefinition", "messageRef", "message"), ("signalEventDefinition", "signalRef", "signal"),
               ("errorEventDefinition", "errorRef", "error"), ("escalationEventDefinition", "escalationRef", "escalation"))
_NO_JSON = object()
_MESSAGE_EXTENSIONS = ("messagePayload", "messageVariable")
_MESSAGE_SENDERS = ("intermediateThrowEvent", "endEvent", "sendTask")
_MESSAGE_CATCHERS = ("startEvent", "intermediateCatchEvent", "boundaryEvent", "receiveTask")
_SCHEMA_LOCK = threading.Lock()
_PROCESS_SELECTION_CODES = frozenset({"no_executable_process", "process_not_found", "process_not_executable",
                                      "process_ambiguous"})


@dataclass(frozen=True)
class ValidationReport:
    """All problems of one validation. ``ok`` is true when there is no error (warnings allowed)."""

    problems: tuple[Problem, ...]
    bpmn_paths: tuple[Path, ...]
    config_path: Path | None = None
    process_id: str | None = None
    config: ProcessConfigFile | None = field(default=None, repr=False, compare=False)
    # Effective config per element id: extension elements, then the config file over them.
    element_configs: Mapping[str, ActivityExtensionConfig] = field(default_factory=dict, repr=False, compare=False)
    # When ``process_id`` is a collaboration's: the processes of its executable pools, which run together.
    pools: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "error")

    @property
    def warnings(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.severity == "warning")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "process_id": self.process_id,
            "pools": list(self.pools),
            "bpmn_files": [str(p) for p in self.bpmn_paths],
            "config_file": str(self.config_path) if self.config_path else None,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [p.to_dict() for p in self.problems],
        }

    def format_report(self) -> str:
        return format_report(self)


def format_report(report: ValidationReport) -> str:
    """One line per problem (``file:line: element 'x': field 'y': message``), then a summary line."""
    files = ", ".join(str(p) for p in report.bpmn_paths)
    lines = [str(p) for p in report.problems]
    n_err, n_warn = len(report.errors), len(report.warnings)
    if report.ok:
        what = f"process {report.process_id!r}" if report.process_id else "process"
        if report.pools:
            what = f"collaboration {report.process_id!r} (pools {', '.join(map(repr, report.pools))}, run together)"
        summary = f"{files}: {what} is valid"
        if n_warn:
            summary += f" ({_plural(n_warn, 'warning')})"
    else:
        summary = f"{files}: {_plural(n_err, 'error')}"
        if n_warn:
            summary += f", {_plural(n_warn, 'warning')}"
        summary += "; nothing runs until they are fixed"
    return "\n".join([*lines, summary])


def raise_for_problems(report: ValidationReport) -> None:
    """Raise ``ProcessError`` naming every error of the report; return quietly when it is ok."""
    if report.ok:
        return
    errors = report.errors
    files = ", ".join(str(p) for p in report.bpmn_paths)
    raise ProcessError(
        f"{_plural(len(errors), 'problem')} in {files}; fix them and run `layerflow validate`:\n  "
        + "\n  ".join(str(p) for p in errors),
        problems=[p.to_dict() for p in errors],
    )


def validate_process(
    bpmn_paths: str | Path | Sequence[str | Path],
    config_path: str | Path | None = None,
    process_id: str | None = None,
    *,
    discover_config: bool = True,
    parser_factory: Callable[[], Any] | None = None,
) -> ValidationReport:
    """Check BPMN files and their config; report every problem, never raise on content.

    ``config_path`` None finds ``<stem>.layerflow.yaml|yml|json`` beside the first BPMN
    file (unless ``discover_config`` is false). ``process_id`` None takes the config
    file's ``process.process_id``, else the one executable process that no loaded process
    calls and that holds a flow node (``report.process_id`` says which; the engine should start that one). ``parser_factory``
    builds the SpiffWorkflow parser of the last check: by default the engine's
    ``engine.spiff.LayerflowBpmnParser`` (stock ``SpiffBpmnParser`` when that module is
    absent), so a process that validates also loads.
    """
    paths = [Path(bpmn_paths)] if isinstance(bpmn_paths, (str, Path)) else [Path(p) for p in bpmn_paths]
    if config_path is None:
        paths = main_file_first(paths, process_id)
    return _Validator(paths, config_path, process_id, discover_config, parser_factory).run()


def read_extension_configs(root: Any) -> dict[str, list[tuple[str, Any]]]:
    """``{element id: [(extension tag, raw JSON text), ...]}`` for every config extension element.

    Order is the merge order (``spiffworkflow:activityConfig`` first, ``layerflow:config``
    over it). Shared with the engine so both read the same elements.
    """
    found: dict[str, list[tuple[str, Any]]] = {}
    for tag in _CONFIG_TAGS:
        for el in root.iter(tag):
            ext = el.getparent()
            owner = ext.getparent() if ext is not None else None
            if ext is None or ext.tag != _bpmn("extensionElements") or owner is None or not owner.get("id"):
                continue
            found.setdefault(owner.get("id"), []).append((tag, el.text or ""))
    return found


# ---------------------------------------------------------------------------------------
# the validator


@dataclass
class _Doc:
    path: Path
    file: str
    data: bytes = b""
    root: Any = None  # lxml element when well-formed and in the BPMN namespace


@dataclass(frozen=True)
class _Node:
    id: str
    tag: str  # local name, e.g. "exclusiveGateway"
    file: str
    line: int | None
    process_id: str | None
    element: Any


@dataclass(frozen=True)
class _Source:
    """One config for one element: from the config file or an extension element."""

    element_id: str
    file: str
    config: ActivityExtensionConfig
    line_of: Callable[..., int | None]


# problems of a config file that leave nothing of it read
_CONFIG_UNREAD = frozenset({"config_syntax", "config_file_type", "config_file_unreadable", "config_not_mapping"})

class _Validator:
    def __init__(self, paths: list[Path], config_path: str | Path | None, process_id: str | None,
                 discover_config: bool, parser_factory: Callable[[], Any] | None) -> None:
        self.paths = paths
        self.config_path = Path(config_path) if config_path is not None else None
        self.config_unread: str | None = None  # the config file, when it could not be read at all
        self.process_id = process_id
        self.leftovers: set[str] = set()  # processes without isExecutable that nothing can start (not the model)
        self.discover_config = discover_config
        self.parser_factory = parser_factory
        self.problems: list[Problem] = []
        self.docs: list[_Doc] = []
        self.nodes: dict[str, _Node] = {}  # flow nodes of every loaded process
        self.other_ids: dict[str, _Node] = {}  # every other element with an id
        self.processes: list[_Node] = []
        self.sources: list[_Source] = []
        self.merged: dict[str, ActivityExtensionConfig] = {}
        # Ids and names our own checks reported on; SpiffWorkflow's (single, cruder) error about
        # the same thing is then left out.
        self.related: set[str] = set()
        self._deprecated_messages: set[str | None] = set()  # bpmn:messages told of message_extension_deprecated
        self.system_keys: frozenset[str] = frozenset()  # the config's system: (L0), once it is read
        self.dmn_files: list[dmn.DmnFile] = []
        self.dmn_ids_missing = False  # a DMN element SpiffWorkflow reads the id of has none (reported)
        self.pools: tuple[str, ...] = ()  # the executable pools' processes of the collaboration to run
        self._config_paths: list[Path] = []  # the config files read (the main process's, called ones')
        self._setters: str | None = None  # what may set a name, as text (``_condition_names_set``)

    def add(self, code: str, message: str, *, file: str | None = None, line: int | None = None,
            element_id: str | None = None, field: str | None = None, column: int | None = None,
            severity: Literal["error", "warning"] = "error") -> None:
        self.problems.append(Problem(code, message, file, line, element_id, field, column, severity))

    def run(self) -> ValidationReport:
        self.paths = dmn.with_dmn_beside(self.paths)
        decision_paths = [p for p in self.paths if dmn.is_dmn(p)]
        self.docs = [self._load(p) for p in self.paths if p not in decision_paths]
        self.dmn_files = [f for f in map(self._load_dmn, decision_paths) if f is not None]
        if decision_paths and not self.docs:
            self.add("bpmn_file_not_found", "only DMN files given: give the BPMN file of the process too (a DMN "
                     "decision runs from a business rule task)", file=str(decision_paths[0]))
        good = [d for d in self.docs if d.root is not None]
        for doc in good:
            self._index(doc)
        config = self._load_config()
        self.system_keys = frozenset(config.system) if config is not None else frozenset()
        main = self._select_process(config)
        if main is not None and not self.pools:
            self._check_started_from_outside(main)
            self._check_signals_between_processes(main)
        for doc in good:
            self._check_extensions(doc)
            self._check_forms(doc)
            self._check_correlations(doc)
            self._check_payloads(doc)
            self._check_escalation_codes(doc)
        self._check_nameless_messages(good)
        if config is not None:
            self._check_config_file(config, main)
        called_configs = called_process_configs([d.path for d in self.docs], config.path if config else None)
        for called in called_configs if self.discover_config else []:
            self.problems.extend(called.problems)
            self._check_config_file(called, main)
            for section in [s for s, values in (("system", called.system), ("data_layers", called.data_layers)) if values]:
                self.add("called_config_section_ignored", f"{section}: of a called process's config file is not read: an instance's "
                         f"{section}: section is read from its main process's config file only; move it there",
                         file=str(called.path), line=called.line_of(section), severity="warning", field=section)
        self._config_paths = [c.path for c in [config, *called_configs] if c is not None and c.path is not None]
        self._check_merges()
        self._check_branches()
        self._check_handlers_run()
        self._check_injects(config)
        self._check_model_limits(config)
        self._check_policy_rules()
        self._check_policy_keys(config)
        self._check_preserve_keys(config)
        self._check_confirm_defaults()
        self._check_join_fields()
        self._check_scope_fields()
        self._check_config_ids()
        self._check_config_types()
        self._check_knowledge()
        self._check_handlers()
        self._check_called_event_subprocesses(main)
        self._check_uncaught_errors(main)
        # Only executable processes run: the others are often pools drawn for the reader. When none
        # is executable, all are checked, so every problem of the one to run is reported at once.
        # When one is chosen (--process, the config, or the only executable one), the others (a
        # collaboration's other pools: SpiffWorkflow runs one process) are checked only when it calls them.
        checked = [p for p in self.processes if _executable(p.element) or p.id == self.process_id] or self.processes
        if self.leftovers:  # the pool's process is the model to check, not the leftover beside it
            checked = [p for p in self.processes if p.id not in self.leftovers]
        if main is not None:
            reached = self._reached_from(main)
            checked = [p for p in checked if p.id in reached] or checked
        for proc in checked:
            self._check_gateways(proc)
            self._check_split_merges(proc)
            self._check_exclusive_into_parallel(proc)
            self._check_reentered_joins(proc)
            self._check_code(proc)
            self._check_condition_names(proc)
            self._check_gateway_conditions(proc)
            self._check_references(proc)
            self._check_shapes(proc)
            self._check_listeners(proc)
            self._check_loops(proc)
            self._check_token_quantities(proc)
        self._check_recursion()
        if good and len(good) == len(self.docs):
            self._check_spiff(main)
        for doc in good:
            self._check_schema(doc)
        return ValidationReport(problems=tuple(self._sorted()), bpmn_paths=tuple(self.paths),
                                config_path=config.path if config else None, process_id=main, config=config,
                                element_configs=MappingProxyType(self.merged), pools=self.pools)

    def _sorted(self) -> list[Problem]:
        # the BPMN files, then the DMN files, then anything else (the config file)
        files = dict.fromkeys([*(d.file for d in self.docs), *map(str, self.paths)])
        order = {f: i for i, f in enumerate(files)}
        return sorted(self.problems, key=lambda p: (order.get(p.file or "", len(order)), p.line or 0))

    # -- files -----------------------------------------------------------------------------

    def _load(self, path: Path) -> _Doc:
        doc = _Doc(path, str(path))
        try:
            doc.data = path.read_bytes()
        except OSError as err:
            self.add("bpmn_file_not_found", f"cannot read BPMN file: {err.strerror or err}; check the path",
                     file=doc.file)
            return doc
        try:
            root = etree.fromstring(doc.data, _xml_parser())
        except etree.XMLSyntaxError as err:
            line, column = err.position if err.position else (err.lineno, None)
            hint = ("; write '<' and '&' inside conditions and scripts as &lt; and &amp;"
                    if any(w in (err.msg or "") for w in ("EntityRef", "StartTag", "xmlParseEntityRef")) else
                    "; fix the XML at this position")
            unbound = _UNBOUND_PREFIX.match(err.msg or "")
            owner = _element_at(doc.data, line, unbound.group(3)) if unbound and line else None
            if unbound:
                prefix, name, tag = unbound.groups()
                where = f"the bpmn:{tag}" + (f" of {owner!r}" if owner else "")
                hint = (f": {where} has {prefix}:{name}, and no xmlns:{prefix} is declared; declare the prefix on "
                        f"bpmn:definitions (xmlns:{prefix}=\"URI\", the namespace of the tool that wrote it), "
                        f"or remove {prefix}:{name}")
            if Path(doc.file).suffix.lower() in (".json", ".yaml", ".yml") or doc.data.lstrip()[:1] in (b"{", b"["):
                # a data, answers or config file given where the BPMN files go (`run P.bpmn data.json`)
                hint = ("; it is no BPMN but JSON or YAML: give start data with --data FILE, answers with --answers "
                        "FILE, the activities' config with --config FILE; only BPMN (and DMN) files go before them")
            self.add("xml_malformed", f"not well-formed XML: {err.msg}{hint}",
                     file=doc.file, line=line or None, column=column or None, element_id=owner)
            return doc
        # comments say nothing to run, and the engine's parser drops them too (a condition or script
        # is then read whole, where its text was cut at a comment)
        etree.strip_elements(root, etree.Comment, etree.ProcessingInstruction, with_tail=False)
        expected = _bpmn("definitions")
        if root.tag != expected:
            ns, _, local = root.tag[1:].partition("}") if root.tag.startswith("{") else ("", "", root.tag)
            if local == "definitions":
                found = f"namespace {ns!r}" if ns else "no namespace"
                self.add("bpmn_namespace", f"root element 'definitions' is in {found}; BPMN 2.0 requires "
                         f"namespace {BPMN_NS!r}: fix the xmlns declaration of the definitions element",
                         file=doc.file, line=root.sourceline, field="xmlns")
            else:
                self.add("bpmn_namespace", f"root element is {local!r} in namespace {ns or '(none)'!r}; a BPMN 2.0 "
                         f"file starts with 'definitions' in namespace {BPMN_NS!r}", file=doc.file,
                         line=root.sourceline)
            return doc
        doc.root = root
        return doc

    def _load_dmn(self, path: Path) -> dmn.DmnFile | None:
        """A DMN file given (or found beside the process): readable, in a DMN namespace, one
        decision with a decision table (what SpiffWorkflow 3.2 runs)."""
        file = str(path)
        try:
            found = dmn.read_dmn(path)
        except OSError as err:
            self.add("bpmn_file_not_found", f"cannot read DMN file: {err.strerror or err}; check the path", file=file)
            return None
        except etree.XMLSyntaxError as err:
            line, column = err.position if err.position else (err.lineno, None)
            self.add("xml_malformed", f"not well-formed XML: {err.msg}; fix the XML at this position", file=file,
                     line=line or None, column=column or None)
            return None
        root = found.root
        if etree.QName(root).localname != "definitions" or found.namespace not in dmn.DMN_NAMESPACES:
            self.add("dmn_namespace", f"root element {etree.QName(root).localname!r} in namespace "
                     f"{found.namespace or '(none)'!r} is no DMN the engine reads: a DMN file starts with "
                     f"'definitions' in one of {', '.join(sorted(dmn.DMN_NAMESPACES))} (DMN 1.1 to 1.3)",
                     file=file, line=root.sourceline, field="xmlns")
            return None
        if not found.decisions:
            self.add("dmn_unsupported", "the file defines no decision (dmn:decision with an id): a business rule "
                     "task runs a decision; add one", file=file, line=root.sourceline)
            return None
        first, line = found.decisions[0]
        if len(found.decisions) > 1:
            others = ", ".join(repr(d) for d, _ in found.decisions[1:])
            self.add("dmn_unsupported", f"the file defines {len(found.decisions)} decisions; SpiffWorkflow 3.2 "
                     f"reads one decision per DMN file ({first!r}, the first): put {others} in a file of its own",
                     file=file, line=found.decisions[1][1], element_id=found.decisions[1][0])
        decision = next(el for el in root if isinstance(el.tag, str) and el.get("id") == first)
        tables = [el for el in decision if isinstance(el.tag, str) and etree.QName(el).localname == "decisionTable"]
        literal = next((el for el in decision if isinstance(el.tag, str)
                        and etree.QName(el).localname == "literalExpression"), None)
        if not tables and literal is not None and (literal.findtext("{*}text") or "").strip():
            self._literal_decision(decision, literal, first, file, line)
        elif len(tables) != 1:
            self.add("dmn_unsupported", f"decision {first!r} has {len(tables) or 'no'} decision table"
                     f"{'s' if len(tables) > 1 else ''}; SpiffWorkflow 3.2 runs a decision by exactly one "
                     "dmn:decisionTable (no literal expressions, no requirement graphs)", file=file, line=line,
                     element_id=first)
        for table in tables:
            self._check_dmn_ids(table, first, file)
            self._check_dmn_entries(table, first, file)
            policy = (table.get("hitPolicy") or "UNIQUE").upper()
            # FIRST and ANY: SpiffWorkflow keeps every matching rule of a table that is not UNIQUE
            # and gives the first one's outputs unless it is COLLECT, which is what they mean
            if policy not in ("UNIQUE", "COLLECT", "FIRST", "ANY"):
                self.add("dmn_unsupported", f"decision table {table.get('id')!r} of decision {first!r} has hit policy "
                         f"{policy}; SpiffWorkflow 3.2 runs UNIQUE, FIRST and ANY (the first matching rule decides) "
                         "and COLLECT (every matching rule, outputs as lists) only: order the rules and use FIRST, "
                         "or use COLLECT", file=file, line=table.sourceline, element_id=first, field="hitPolicy")
            aggregation = (table.get("aggregation") or "").strip().upper()
            if policy == "COLLECT" and aggregation:
                # Camunda gives the SUM (COUNT, MIN, MAX) of the matched rules' outputs; SpiffWorkflow
                # gives their list, whatever the table says
                outputs = [o.get("name") for o in table
                           if isinstance(o.tag, str) and etree.QName(o).localname == "output" and o.get("name")]
                out = outputs[0] if len(outputs) == 1 else "result"
                fn = {"SUM": "sum", "COUNT": "len", "MIN": "min", "MAX": "max"}.get(aggregation, "sum")
                self.add("dmn_unsupported", f"decision table {table.get('id')!r} of decision {first!r} has hit "
                         f"policy COLLECT with aggregation {aggregation}; SpiffWorkflow 3.2 ignores the aggregation "
                         "and gives the list of every matched rule's output instead of one value: remove "
                         f"aggregation=\"{table.get('aggregation')}\" and compute it in a script task after the "
                         f"business rule task ({out} = {fn}({out}))", file=file, line=table.sourceline,
                         element_id=first, field="aggregation")
            self._check_dmn_defaults(table, first, policy, file)
            self._check_dmn_output_names(table, first, file)
        return found

    def _check_dmn_output_names(self, table: Any, decision: str, file: str) -> None:
        """An output with no name (dmn-js and Camunda's DMN editor leave it empty until one is
        typed): SpiffWorkflow sets the variable its name gives, else its label; with neither, the
        key is '' and the business rule task stops the run (no context key is empty). A label that
        is no variable name is a key no condition or script can read by its name."""
        for output in (o for o in table if isinstance(o.tag, str) and etree.QName(o).localname == "output"):
            if (output.get("name") or "").strip():
                continue
            label, oid = (output.get("label") or "").strip(), output.get("id") or decision
            if not label:
                self.add("dmn_unsupported", f"decision {decision!r}, output {oid!r} has no name and no label: "
                         "SpiffWorkflow sets the variable an output's name gives (else its label), so this "
                         "one's value would go under an empty key, and the run stops at the business rule task; "
                         "give the output the variable to set: name=\"...\"", file=file, line=output.sourceline,
                         element_id=oid, field="name")
            elif not label.isidentifier():
                self.add("dmn_unsupported", f"decision {decision!r}, output {oid!r} has no name, so SpiffWorkflow "
                         f"sets its label, {label!r}, which no condition or script can read by its name; give the "
                         f"output the variable to set: name=\"{_identifier_for(label)}\"", file=file,
                         line=output.sourceline, element_id=oid, field="name", severity="warning")

    def _literal_decision(self, decision: Any, literal: Any, first: str, file: str, line: int | None) -> None:
        """A decision given by a literal expression (DMN's boxed expression, as the DMN TCK and
        dmn-scala write a one-line decision): SpiffWorkflow 3.2 runs decision tables only, and its
        parser fails at the business rule task (IndexError). It is one assignment: a script task."""
        text = " ".join((literal.findtext("{*}text") or "").split())
        variable = next((el for el in decision if isinstance(el.tag, str)
                         and etree.QName(el).localname == "variable"), None)
        name = (variable.get("name") if variable is not None else None) or decision.get("name") or first
        name = name if name.isidentifier() else "result"
        instead = _python_instead("=" + text, "FEEL")
        if not instead.startswith("write '"):
            try:
                ast.parse(text, mode="eval")
                instead = f"write {text!r}"
            except SyntaxError:
                instead = ""
        todo = (f"{name} = {instead[len('write '):].split(' (', 1)[0].strip(chr(39))}" if instead.startswith("write ")
                else f"{name} = (the expression in Python)")
        self.add("dmn_unsupported", f"decision {first!r} is a literal expression ({text!r}), not a decision table; "
                 "SpiffWorkflow 3.2 runs a decision by exactly one dmn:decisionTable: draw a script task in place "
                 f"of the business rule task that runs it, with the script {todo}", file=file,
                 line=literal.sourceline or line, element_id=first, field="literalExpression")

    def _check_dmn_defaults(self, table: Any, decision: str, policy: str, file: str) -> None:
        """An output's defaultOutputEntry (DMN 1.2: the value when no rule matches, as Camunda's
        and dmn-scala's tables write it): SpiffWorkflow 3.2 does not read it, and a table no rule
        of which matches sets nothing, so the first condition or script that reads the output
        stops the run (NameError). The same value from a last rule that matches anything: the first
        matching rule decides, unless the table is COLLECT."""
        inputs = sum(1 for el in table if isinstance(el.tag, str) and etree.QName(el).localname == "input")
        for output in (o for o in table if isinstance(o.tag, str) and etree.QName(o).localname == "output"):
            entry = next((el for el in output if isinstance(el.tag, str)
                          and etree.QName(el).localname == "defaultOutputEntry"), None)
            text = entry.findtext("{*}text") if entry is not None else None
            if not (text or "").strip():
                continue
            name = output.get("name") or output.get("label") or output.get("id") or "(unnamed)"
            value = (text or "").strip()
            if policy == "COLLECT":
                todo = (f"remove it and, in a script task after the business rule task, give {name!r} the value "
                        f"when no rule matched: if not {name}: {name} = [{value}]")
            else:
                todo = (f"remove it and add a last rule whose {inputs} input entr{'ies are' if inputs != 1 else 'y is'}"
                        f" empty (it matches anything) and whose output is {value}: the first matching rule decides, "
                        "so it gives the value only when no other rule matches")
            self.add("dmn_unsupported", f"decision {decision!r}, output {name!r}: its defaultOutputEntry ({value}) "
                     "is the value when no rule matches, and SpiffWorkflow 3.2 does not read it: when no rule "
                     f"matches, {name!r} is not set, and the first condition or script that reads it stops the "
                     f"run; {todo}", file=file, line=entry.sourceline if entry is not None else output.sourceline,
                     element_id=output.get("id") or decision, field="defaultOutputEntry")

    def _check_dmn_ids(self, table: Any, decision: str, file: str) -> None:
        """SpiffWorkflow's DMN parser reads the id of a decision table, its inputs, outputs, rules and
        their entries (a KeyError('id') otherwise, reported at the business rule task); Camunda's older
        DMN editor wrote tables without one."""
        def local(el: Any) -> str:
            return str(etree.QName(el).localname) if isinstance(el.tag, str) else ""

        def missing(el: Any, what: str) -> None:
            if (el.get("id") or "").strip():
                return
            self.dmn_ids_missing = True
            self.add("dmn_unsupported", f"{what} of decision {decision!r} has no id; SpiffWorkflow's DMN parser "
                     "needs one on the decisionTable and on each of its input, output, rule, inputEntry and "
                     f'outputEntry: add an id unique in the file (<{local(el)} id="..."), as DMN editors write',
                     file=file, line=el.sourceline, element_id=decision, field="id")

        missing(table, "the decisionTable")
        rules = 0
        for child in table:
            kind = local(child)
            if kind in ("input", "output"):
                missing(child, f"{kind} {child.get('label') or child.get('name') or ''!r}".replace(" ''", ""))
            elif kind == "rule":
                rules += 1
                missing(child, f"rule {rules}")
                for entry in child:
                    if local(entry) in ("inputEntry", "outputEntry"):
                        missing(entry, f"an {local(entry)} of rule {rules} ({child.get('id') or 'no id'})")

    def _check_dmn_entries(self, table: Any, decision: str, file: str) -> None:
        """SpiffWorkflow's DMN engine runs entries as Python: an input entry is a value to compare
        (``"glass"``), a comparison to finish (``< 50000``) or a test of ``?`` (``0 <= ? < 50000``);
        an output entry is an expression. FEEL beyond that (ranges, ``not(...)``) fails at run time."""
        def parses(text: str) -> bool:
            try:
                ast.parse(text, mode="eval")
            except (SyntaxError, ValueError):
                return False
            return True

        self._check_dmn_inputs(table, decision, file)
        for row, rule in enumerate((r for r in table if isinstance(r.tag, str) and etree.QName(r).localname == "rule"),
                                   start=1):
            for entry in rule:
                if not isinstance(entry.tag, str):
                    continue
                kind = etree.QName(entry).localname
                text = (entry.findtext(f"{{{etree.QName(entry).namespace}}}text") or "").strip()
                if kind not in ("inputEntry", "outputEntry") or not text or text == "-":
                    continue
                if kind == "inputEntry":
                    test = text.replace("?", "dmninput")
                    ok = parses(test) if "?" in text else parses(text) or parses(f"v {text}")
                    if ok and re.match(r"not\s*\(", text):
                        ok = False  # FEEL's negation: Python reads not("x") as False, matching nothing
                    fix = ("write it as Python: a value (\"glass\"), a comparison to finish (< 50000, != \"glass\"), "
                           "or a test of ? (0 <= ? < 50000); '-' or empty matches anything")
                    values = _feel_value_list(text) if ok and "?" not in text else None
                    interval = _feel_range(text) if not ok else None
                    if interval:
                        # FEEL's interval ([600..699], Camunda's and Operaton's tables): the same test of ?
                        fix = f"a range is FEEL's; write it as Python: '{_FEEL_TEMPORAL.sub(lambda m: m.group(2), interval)}'"
                    negation = _feel_negation(text) if not ok else None
                    if negation:
                        fix = f"FEEL's not(...) matches any other value; write it as Python: '{negation}'"
                    if values:
                        # FEEL's list of the values to match: Python compares the input to the whole
                        # tuple, so the rule never matches (and the next one silently decides)
                        ok = False
                        fix = (f"a list of values is FEEL's 'one of these'; SpiffWorkflow compares the input to the "
                               f"whole tuple, so the rule never matches: write '? in ({', '.join(values)})'")
                else:
                    ok, fix = parses(text), "write a Python expression (\"low\", 50000, amount * 0.1)"
                temporal = sorted({m.group(1) for m in _FEEL_TEMPORAL.finditer(text)}) if ok else []
                if temporal:
                    # Python reads date and time("...") as the name date, and a call of time(): the run
                    # stops with "name 'time' is not defined"
                    ok = False
                    fix = (f"{', '.join(f'FEEL{chr(39)}s {name}(...)' for name in temporal)} is no function here; "
                           "ISO 8601 text compares in time order when written alike: write it as "
                           f"{_FEEL_TEMPORAL.sub(lambda m: m.group(2), text)!r}")
                called = _feel_calls(text.replace("?", "dmninput")) if ok else None
                if called is not None:
                    # FEEL's string(), floor(), count(): Python calls of names nothing defines, and the
                    # run stopped with "NameError: name 'string' is not defined", told to give it a value
                    ok = False
                    fix = called
                if kind == "inputEntry" and not ok and _FEEL_DURATION.search(text):
                    # ISO 8601 durations do not compare in order as text ("P10D" sorts before "P2D",
                    # "P1Y" before "P6M"): the test to write compares numbers
                    fix = _duration_test_instead(text)
                literals = _feel_literals(text.replace("?", "dmninput"), kind) if ok else []
                if literals:
                    # FEEL's true / false / null: in Python unknown names, the run fails on them
                    ok = False
                    fix = ", ".join(f"{name!r} is FEEL's: write {_PYTHON_LITERALS.get(name.lower(), 'None')}"
                                    for name in literals)
                if not ok:
                    self.add("dmn_unsupported", f"decision {decision!r}, rule {row} ({rule.get('id')!r}): "
                             f"{kind} {text!r} is not what SpiffWorkflow's DMN engine runs (Python, not FEEL); "
                             f"{fix}", file=file, line=entry.sourceline, element_id=entry.get("id") or rule.get("id"),
                             field=kind)

    def _check_dmn_inputs(self, table: Any, decision: str, file: str) -> None:
        """An input's inputExpression is a Python expression over the context in SpiffWorkflow's DMN
        engine; Camunda's tables call FEEL's functions there (``upper case(country)``), which is no
        Python: the run stopped with 'invalid syntax (<unknown>, line 1)', naming no input."""
        inputs = [c for c in table if isinstance(c.tag, str) and etree.QName(c).localname == "input"]
        for column, clause in enumerate(inputs):
            ns = etree.QName(clause).namespace
            expression = clause.find(f"{{{ns}}}inputExpression")
            text_el = expression.find(f"{{{ns}}}text") if expression is not None else None
            text = (text_el.text or "").strip() if text_el is not None else ""
            if not text:
                self._check_empty_input(table, clause, column, decision, file)
                continue
            parsed = python_source(text) is not None
            called = _feel_calls(text) if parsed else None
            if parsed and not _FEEL_TEMPORAL.search(text) and called is None:
                continue
            instead = _FEEL_TEMPORAL.sub(lambda m: m.group(2), text)
            for pattern, python in _FEEL_STRING_FUNCTIONS:
                instead = re.sub(pattern, python, instead)
            fix = (f"write it as {instead!r}" if instead != text and python_source(instead) is not None else
                   called if called is not None else
                   "write a Python expression over the context (country.upper(), amount * 12)")
            label = clause.get("label") or clause.get("name") or clause.get("id")
            self.add("dmn_unsupported", f"decision {decision!r}, input {label!r} ({clause.get('id')!r}): "
                     f"inputExpression {text!r} is not what SpiffWorkflow's DMN engine runs (Python, not FEEL); "
                     f"{fix}", file=file, line=text_el.sourceline if text_el is not None else clause.sourceline,
                     element_id=expression.get("id") or clause.get("id") if expression is not None else
                     clause.get("id"), field="inputExpression")

    def _check_empty_input(self, table: Any, clause: Any, column: int, decision: str, file: str) -> None:
        """An input with an empty inputExpression (Camunda's DMN editor leaves one so until it is
        written) that a rule tests: SpiffWorkflow then reads the variable named by the input's label,
        and the run stopped with "WorkflowTaskException: 'Country'". An error where the label can be
        no variable ("Customer Age"), a warning where the context may hold it."""
        tested = [rule.get("id") for rule in table if isinstance(rule.tag, str)
                  and etree.QName(rule).localname == "rule"
                  for n, entry in enumerate(e for e in rule if isinstance(e.tag, str)
                                            and etree.QName(e).localname == "inputEntry")
                  if n == column and (entry.findtext(f"{{{etree.QName(entry).namespace}}}text") or "").strip()
                  not in ("", "-")]
        if not tested:
            return  # no rule tests it: SpiffWorkflow never reads it
        label = clause.get("label") or ""
        name = re.sub(r"\W+", "_", label.strip().lower()).strip("_") or "value"
        reads = (f"reads the variable named by its label, {label!r}, and the run stops unless the context holds "
                 "that key" if label.isidentifier() else
                 f"reads the variable named by its label, {label!r}, which no variable can be named, and the run "
                 "stops there")
        self.add("dmn_unsupported", f"decision {decision!r}, input {label or clause.get('id')!r} "
                 f"({clause.get('id')!r}): its inputExpression is empty, and rule {tested[0]!r} tests it; SpiffWorkflow "
                 f"then {reads}: write the context key the input reads as its inputExpression (<text>{name}</text>)",
                 file=file, line=clause.sourceline, element_id=clause.get("id"), field="inputExpression",
                 severity="warning" if label.isidentifier() else "error")

    def _index(self, doc: _Doc) -> None:
        seen: dict[str, int | None] = {}
        for el in doc.root.iter():
            if not isinstance(el.tag, str):  # comments, processing instructions
                continue
            eid = el.get("id")
            if not eid or etree.QName(el).namespace != BPMN_NS:
                # ids on other namespaces' elements (a modeler's extensions, diagram shapes) are
                # theirs: SpiffWorkflow looks none of them up, and Camunda repeats form-field ones
                continue
            if eid in seen:
                self.add("duplicate_id", f"id {eid!r} is used twice in this file (first on line {seen[eid]}); "
                         "ids must be unique: rename one", file=doc.file, line=el.sourceline, element_id=eid)
                continue
            seen[eid] = el.sourceline
            proc = next((a for a in el.iterancestors(_bpmn("process"))), None)
            node = _Node(eid, etree.QName(el).localname, doc.file, el.sourceline,
                         proc.get("id") if proc is not None else None, el)
            if el.tag == _bpmn("process"):
                twin = next((p for p in self.processes if p.id == eid), None)
                if twin is not None:
                    # SpiffWorkflow refuses it too, naming neither file; one process is kept
                    self.related.add(eid)
                    self.add("duplicate_id", f"process {eid!r} is defined in {twin.file} (line {twin.line}) too: "
                             "SpiffWorkflow loads one process per id; give only one of the files, or rename one "
                             "process (and the calledElement of the calls meant for it)", file=doc.file,
                             line=el.sourceline, element_id=eid)
                    continue
                self.processes.append(node)
                self.other_ids.setdefault(eid, node)
            elif el.tag in _FLOW_NODES and proc is not None:
                self.nodes.setdefault(eid, node)
            else:
                self.other_ids.setdefault(eid, node)

    def _load_config(self) -> ProcessConfigFile | None:
        path = self.config_path
        if path is None and self.discover_config and self.docs:
            found = configs_beside(self.docs[0].path)
            if len(found) > 1:
                self.add("config_ambiguous", f"several config files beside the process ({', '.join(p.name for p in found)});"
                         f" using {found[0].name}: remove the others or pass --config",
                         file=str(found[0]), severity="warning")
            path = found[0] if found else None
        if path is None:
            return None
        config = load_config_file(path)
        self.problems.extend(config.problems)
        if any(p.code in _CONFIG_UNREAD for p in config.problems):
            self.config_unread = str(path)
        return config

    # -- which process ---------------------------------------------------------------------

    def _select_process(self, config: ProcessConfigFile | None) -> str | None:
        wanted, file, line = self.process_id, (self.docs[0].file if self.docs else None), None
        from_config = wanted is None and config is not None and config.process_id is not None
        if from_config:
            assert config is not None
            wanted, file, line = config.process_id, str(config.path), config.line_of("process", "process_id")
        if not any(d.root is not None for d in self.docs):
            return None
        if wanted is not None:
            proc = next((p for p in self.processes if p.id == wanted), None)
            if proc is None:
                present = ", ".join(f"{self._named(p)}{'' if _executable(p.element) else ' (not executable)'}"
                                    for p in self.processes) or "none"
                todo = ("set process.process_id in the config file to one of them" if from_config
                        else "pass one of them as the process id (--process ID)")
                other = self.other_ids.get(wanted)
                if other is not None and other.tag == "participant" and other.element.get("processRef"):
                    what = f"; {wanted!r} is the pool (participant) of process {other.element.get('processRef')!r}"
                elif other is not None and other.tag == "collaboration":
                    return self._select_collaboration(other, file, line)
                else:
                    what = _did_you_mean(wanted, [p.id for p in self.processes])
                self.add("process_not_found", f"process {wanted!r} is not in {self._files()}"
                         f"{what}; processes present: {present}; {todo}",
                         file=file, line=line, field="process_id")
                return None
            if not _executable(proc.element):
                self.add("process_not_executable", f"process {wanted!r} has isExecutable="
                         f"{proc.element.get('isExecutable')!r}; set isExecutable=\"true\" on it to run it",
                         file=proc.file, line=proc.line, element_id=proc.id, field="isExecutable")
                return None
            self._warn_unset(proc)
            return wanted
        executable = [p for p in self.processes if _executable(p.element)]
        leftovers = [p for p in executable if p.element.get("isExecutable") is None and not _startable(p.element)]
        marked = [p for p in self.processes if not _executable(p.element) and _startable(p.element)]
        if executable and leftovers == executable and marked:
            # Only processes without isExecutable, and none of them can start (Trisotech writes one holding a
            # lone end event beside the pool's process): the pool's process, marked not executable, is the model
            self.leftovers = {p.id for p in leftovers}
            named = ", ".join(map(repr, sorted(self.leftovers)))
            for p in marked:
                self.add("no_executable_process", f"no executable process: process {p.id!r} has isExecutable="
                         f"{p.element.get('isExecutable')!r}; set isExecutable=\"true\" on the process to run it "
                         f"(process {named}, the only one not marked isExecutable=\"false\", has no start event: "
                         "nothing can start it)", file=p.file, line=p.line, element_id=p.id, field="isExecutable")
            return None
        if not executable:
            if not self.processes:
                message = f"no bpmn:process in {self._files()}; add a process with isExecutable=\"true\""
                self.add("no_executable_process", message, file=file, line=None)
            else:
                for p in self.processes:
                    self.add("no_executable_process", f"no executable process: process {p.id!r} has isExecutable="
                             f"{p.element.get('isExecutable')!r}; set isExecutable=\"true\" on the process to run",
                             file=p.file, line=p.line, element_id=p.id, field="isExecutable")
            return None
        # A process that another one calls is not the one to start.
        called = {c.get("calledElement") for p in self.processes for c in p.element.iter(_bpmn("callActivity"))}
        roots = [p for p in executable if p.id not in called] or executable
        # A pool drawn empty (Bizagi's main participant beside the pool that holds the flow) has nothing to run.
        roots = [p for p in roots if next(p.element.iterchildren(*_FLOW_NODES), None) is not None] or roots
        # nor is a process without isExecutable that nothing can start (a modeler's leftover beside the pool)
        roots = [p for p in roots if p.element.get("isExecutable") is not None or _startable(p.element)] or roots
        if len(roots) > 1:
            together = [c for c in self.other_ids.values() if c.tag == "collaboration"
                        and {r.id for r in roots} <= {pid for _, pid in _pools(c.element)}]
            talking = [c for c in together if _messages_between(c.element, {r.id for r in roots}, self.nodes)]
            if len(talking) == 1:  # pools that exchange messages: they run together
                return self._select_collaboration(talking[0], file, None)
            hint = (f", or the collaboration {together[0].id!r} to run its pools together" if together else "")
            self.add("process_ambiguous", f"{len(roots)} executable processes ({', '.join(map(self._named, roots))}) "
                     f"and no process id; pass the id of the one to run{hint} (--process ID on the command line, "
                     "process_id= in Python, or process.process_id in the config file)",
                     file=file, field="process_id")
            return None
        self._warn_unset(roots[0])
        return roots[0].id

    def _select_collaboration(self, collab: _Node, file: str | None, line: int | None) -> str | None:
        """A collaboration runs its executable pools together (``engine.collaboration``); its
        message flows must be ones layerflow can carry. Returns its id, None when it cannot run."""
        by_id = {p.id: p for p in self.processes}
        pools = _pools(collab.element)
        running = [pid for _, pid in pools if pid in by_id and _executable(by_id[pid].element)]
        if not running:
            drawn = ", ".join(f"{pool!r} -> {pid!r}" if pid else f"{pool!r} (no process)" for pool, pid in pools)
            self.add("collaboration_not_executable", f"collaboration {collab.id!r} has no pool whose process is "
                     f"executable (pools: {drawn or 'none'}); set isExecutable=\"true\" on the process of each pool "
                     "to run", file=collab.file, line=collab.line, element_id=collab.id)
            return None
        for pid in running:
            self._warn_unset(by_id[pid])
        self.pools = tuple(running)
        self._check_message_flows(collab, set(running))
        self._check_pool_starts(collab, [by_id[pid] for pid in running])
        return collab.id

    def _check_pool_starts(self, collab: _Node, running: list[_Node]) -> None:
        """A pool whose process starts on a message starts when another pool sends it; when every pool
        does, nothing starts the conversation. A pool's message or signal event sub-process never starts:
        its process runs as a called one (SpiffWorkflow starts those at the top level only)."""
        def message_started(proc: _Node) -> bool:
            starts = list(proc.element.iterchildren(_bpmn("startEvent")))
            return bool(starts) and all(s.find(_bpmn("messageEventDefinition")) is not None for s in starts)

        if all(message_started(p) for p in running):
            self.add("collaboration_never_starts", f"collaboration {collab.id!r}: every pool's process starts with "
                     f"a message start event ({', '.join(repr(p.id) for p in running)}), so nothing starts the "
                     "conversation (a pool's message start event is started by another pool, not from outside); "
                     "give the pool that begins it a plain start event", file=collab.file, line=collab.line,
                     element_id=collab.id)
        for proc in running:
            for sub, start, kind in _message_event_subprocesses(proc.element):
                self.add("pool_event_subprocess_never_starts", f"event sub-process {sub.get('id')!r} of pool "
                         f"process {proc.id!r} starts on a {kind}: in collaboration {collab.id!r} each "
                         "pool's process runs as a called process, and SpiffWorkflow 3.2 starts such event "
                         f"sub-processes in the top-level process only, so {start.get('id')!r} never catches "
                         f"it; catch the {kind} with a catch event or an event-based gateway on the "
                         "pool's path instead", file=proc.file, line=start.sourceline,
                         element_id=start.get("id"), severity="warning")

    def _check_started_from_outside(self, main: str) -> None:
        """The process to run, alone, drawn as a pool of a collaboration whose other pool feeds its
        message start event (MIWG C.1.0: the team assistant's scan starts the engine's invoice
        process). Nobody runs the other pool: an instance starts waiting at the message start
        event, and goes on only once the message is sent to it."""
        messages = {m.get("id"): m.get("name") or m.get("id") for doc in self.docs if doc.root is not None
                    for m in doc.root.iter(_bpmn("message"))}
        for collab in (n for n in self.other_ids.values() if n.tag == "collaboration"):
            pools = dict(_pools(collab.element))
            if main not in pools.values():
                continue
            names = {el.get("id"): el.get("name") or el.get("id") for el in collab.element.iter(_bpmn("participant"))}
            for flow in collab.element.iter(_bpmn("messageFlow")):
                start = self.nodes.get(flow.get("targetRef") or "")
                if start is None or start.process_id != main or start.tag != "startEvent" \
                        or start.element.getparent().tag != _bpmn("process"):
                    continue
                wanted = _message_of(start.element, messages)
                if wanted is None:
                    continue  # event_without_ref says what to do
                source = self.nodes.get(flow.get("sourceRef") or "")
                src_pid = source.process_id if source is not None else pools.get(flow.get("sourceRef") or "")
                if src_pid == main:
                    continue
                pool = next((names[k] for k, v in pools.items() if v == src_pid), None) or names.get(
                    flow.get("sourceRef") or "") or src_pid
                self.add("message_flow_from_outside", f"message flow {flow.get('id')!r} from pool {pool!r} starts "
                         f"process {main!r} at its message start event {start.id!r}, and layerflow runs {main!r} "
                         f"alone (not pool {pool!r}): an instance starts waiting at {start.id!r} for message "
                         f"{wanted!r}, and runs on only once it is sent: `layerflow send INSTANCE_ID "
                         f"{shlex.quote(wanted)} --data PAYLOAD` (or POST /api/instances/{{id}}/events); to start at "
                         "once with the data given to `layerflow run --data`, draw a plain start event in its place"
                         + (f" (or run the collaboration {collab.id!r} with that pool's process executable, to have "
                            "it send the message)" if src_pid is not None else
                            f" (pool {pool!r} is drawn as a black box: the message comes from outside the files)"),
                         file=collab.file, line=flow.sourceline, element_id=flow.get("id"), severity="warning")

    def _check_message_flows(self, collab: _Node, running: set[str]) -> None:
        """What layerflow carries between pools: a message a throw event, end event or send task of
        one running pool sends, caught (by its message's name, as SpiffWorkflow routes it) by a catch
        event, receive task or message start event of another. Correlation between pools is not
        supported: one instance is one conversation."""
        messages = {m.get("id"): m.get("name") or m.get("id") for doc in self.docs if doc.root is not None
                    for m in doc.root.iter(_bpmn("message"))}
        pools = dict(_pools(collab.element))
        names = {el.get("id"): el.get("name") or el.get("id") for el in collab.element.iter(_bpmn("participant"))}
        for flow in collab.element.iter(_bpmn("messageFlow")):
            fid = flow.get("id")
            ends: dict[str, tuple[_Node | None, str | None, str | None]] = {}
            for side in ("sourceRef", "targetRef"):
                ref = flow.get(side) or ""
                node = self.nodes.get(ref)
                if node is not None:
                    ends[side] = (node, node.process_id, _message_of(node.element, messages))
                else:  # drawn to the pool's border (a pool drawn as a black box has no process)
                    ends[side] = (None, pools.get(ref), None)
            (src, src_pid, sent), (dst, dst_pid, wanted) = ends["sourceRef"], ends["targetRef"]
            where = dict(file=collab.file, line=flow.sourceline, element_id=fid)

            def pool_of(ref: str, pid: str | None) -> str:
                pool = next((names[k] for k, v in pools.items() if v == pid), None) if pid else names.get(ref)
                return repr(pool or pid or ref)

            def not_run(pid: str | None) -> str:
                """Why layerflow does not run that side's process, and what to do to run it."""
                if pid is None:
                    return "its process is not drawn: a black-box pool"
                if pid not in pools.values():  # a process the collaboration draws no pool for
                    return (f"no bpmn:participant of collaboration {collab.id!r} has processRef={pid!r}; add "
                            "one to run that process too")
                return "its process is not executable; set isExecutable=\"true\" on it to run it too"

            if dst_pid not in running:
                self.add("message_flow_not_run", f"message flow {fid!r} leads to pool "
                         f"{pool_of(flow.get('targetRef') or '', dst_pid)}, which layerflow does not run "
                         f"({not_run(dst_pid)}): what {flow.get('sourceRef')!r} sends there is delivered to no one; "
                         "or keep the flow as documentation", severity="warning", **where)
                continue
            if src_pid not in running:
                waits = (f"the instance waits at {flow.get('targetRef')!r} until that message is sent from outside "
                         "(layerflow send INSTANCE_ID MESSAGE_NAME, or the REST API)" if dst is None or wanted
                         else f"{dst.tag} {dst.id!r} waits for no message, so nothing waits for it there; draw it "
                         "as a receive task or message catch event to wait for the message from outside")
                self.add("message_flow_from_outside", f"message flow {fid!r} comes from pool "
                         f"{pool_of(flow.get('sourceRef') or '', src_pid)}, which layerflow does not run "
                         f"({not_run(src_pid)}): {waits}", severity="warning", **where)
                continue
            if src is None or sent is None:
                what = f"the border of pool {pool_of(flow.get('sourceRef') or '', src_pid)}" if src is None else \
                    f"{src.tag} {src.id!r}"
                self.add("message_flow_sends_nothing", f"message flow {fid!r} starts at {what}, which sends no "
                         "message: SpiffWorkflow sends one only from a message intermediate throw event, message end "
                         "event or send task (with a messageRef); draw the sender as one of those, with the "
                         "bpmn:message the receiver waits for", **where)
                continue
            if dst is None:
                catchers = [n for n in self.nodes.values() if n.process_id == dst_pid
                            and _message_of(n.element, messages) == sent and n.tag in _CATCHING]
                if not catchers:
                    self.add("message_flow_receives_nothing", f"message flow {fid!r} carries message {sent!r} to "
                             f"pool {pool_of('', dst_pid)}, where nothing waits for it: draw a message catch event, "
                             "receive task or message start event for it in that pool's process", **where)
                continue
            if wanted is None:
                self.add("message_flow_receives_nothing", f"message flow {fid!r} ends at {dst.tag} {dst.id!r}, which "
                         "waits for no message: SpiffWorkflow delivers one only to a message catch event, receive "
                         f"task, message boundary event or message start event; draw it as one waiting for {sent!r}",
                         **where)
            elif wanted != sent:
                self.add("message_flow_mismatch", f"message flow {fid!r}: {src.id!r} sends message {sent!r} and "
                         f"{dst.id!r} waits for message {wanted!r}; SpiffWorkflow routes a message by its name, not "
                         "by the message flow: give both ends the same bpmn:message (messageRef)", **where)
        correlated = sorted({m.getparent().get("messageRef") or "" for doc in self.docs if doc.root is not None
                             for m in doc.root.iter(_bpmn("correlationPropertyRetrievalExpression"))} - {""})
        keys = [k.get("id") or k.get("name") for k in collab.element.iter(_bpmn("correlationKey"))]
        if keys or correlated:
            what = (f"correlation key(s) {', '.join(map(repr, keys))}" if keys
                    else f"correlation properties on message(s) {', '.join(map(repr, correlated))}")
            self.add("collaboration_correlation", f"collaboration {collab.id!r} has {what}: layerflow runs a "
                     "collaboration as one instance, one conversation, and does not correlate messages between its "
                     "pools; remove the correlation keys and properties (each instance is one conversation), or run "
                     "each pool as a process of its own (--process ID) and send its messages with layerflow send",
                     file=collab.file, line=collab.line, element_id=collab.id)

    def _warn_unset(self, proc: _Node) -> None:
        if proc.element.get("isExecutable") is None:
            self.add("process_executable_unset", f"process {proc.id!r} has no isExecutable attribute; SpiffWorkflow "
                     "runs it anyway, other BPMN tools treat it as not executable: add isExecutable=\"true\"",
                     file=proc.file, line=proc.line, element_id=proc.id, field="isExecutable", severity="warning")

    def _named(self, proc: _Node) -> str:
        """``'Process_1'``, with the name of its pool when a collaboration draws it as one."""
        pool = next((n.element.get("name") for n in self.other_ids.values()
                     if n.tag == "participant" and n.element.get("processRef") == proc.id), None)
        return f"{proc.id!r} (pool {pool!r})" if pool else repr(proc.id)

    def _files(self) -> str:
        return ", ".join(d.file for d in self.docs)

    # -- config ----------------------------------------------------------------------------

    def _check_extensions(self, doc: _Doc) -> None:
        found: dict[str, list[tuple[int, Any, int]]] = {}  # owner id -> [(rank, JSON data, line)]
        for el in doc.root.iter():
            if not isinstance(el.tag, str):
                continue
            ext = el.getparent()
            if el.tag not in _CONFIG_TAGS:
                local = etree.QName(el).localname
                if ext is not None and ext.tag == _bpmn("extensionElements") and local in ("config", "activityConfig"):
                    expected = LAYERFLOW_NS if local == "config" else SPIFF_NS
                    self.add("config_namespace", f"<{local}> in namespace {etree.QName(el).namespace!r} is ignored; "
                             f"layerflow reads {local} elements in namespace {expected!r}: fix the xmlns declaration",
                             file=doc.file, line=el.sourceline, element_id=_owner_id(ext), severity="warning")
                continue
            prefix = "layerflow:config" if el.tag == _LF_CONFIG else "spiffworkflow:activityConfig"
            owner = ext.getparent() if ext is not None else None
            if ext is None or ext.tag != _bpmn("extensionElements") or owner is None:
                self.add("config_misplaced", f"<{prefix}> is ignored here; put it inside the <bpmn:extensionElements> "
                         "of the task or gateway it configures", file=doc.file, line=el.sourceline,
                         element_id=_owner_id(ext))
                continue
            owner_id = owner.get("id")
            if owner.tag not in _FLOW_NODES:
                self._not_a_flow_node(owner_id or "(no id)", etree.QName(owner).localname, doc.file, el.sourceline)
                continue
            data = self._extension_json(doc, el, owner_id, prefix)
            if data is not _NO_JSON:
                found.setdefault(owner_id, []).append((_CONFIG_TAGS.index(el.tag), data, el.sourceline))
        for owner_id, parts in found.items():
            self._extension_config(doc, owner_id, sorted(parts, key=lambda part: part[0]))

    def _check_forms(self, doc: _Doc) -> None:
        """A user task's form declaration (``engine.forms``): a Camunda field of an unknown type, an
        enum with no values, a default that does not fit; a SpiffArena JSON Schema file that is
        missing, not JSON, or not a JSON Schema."""
        from .forms import form_problems

        for el in doc.root.iter(_bpmn("userTask"), _bpmn("startEvent")):
            if el.tag == _bpmn("startEvent"):
                parent = el.getparent()
                if parent is None or parent.tag != _bpmn("process") or any(
                        isinstance(child.tag, str) and child.tag.endswith("EventDefinition") for child in el):
                    continue  # a sub-process's, a message, signal or timer start: no start data to check
                what = "start event form"
                problems, warnings = form_problems(el, str(doc.path))
                # form_problems speaks of a user task's answers: here the form checks the start data
                warnings = [(f, m.replace("answers to this task are", "the start data is")) for f, m in warnings]
            else:
                what = "user task form"
                problems, warnings = form_problems(el, str(doc.path))
            for field_id, message in problems:
                self.add("invalid_form", f"{what}: {message}", file=doc.file,
                         line=el.sourceline, element_id=el.get("id"), field=field_id)
            for field_id, message in warnings:
                self.add("form_schema_missing", f"{what}: {message}", file=doc.file,
                         line=el.sourceline, element_id=el.get("id"), field=field_id, severity="warning")

    def _extension_json(self, doc: _Doc, el: Any, owner_id: str, prefix: str) -> Any:
        text = el.text or ""
        if not text.strip():
            return _NO_JSON
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            offset = text.count("\n", 0, err.pos)
            self.add("invalid_config_json", f"<{prefix}> is not valid JSON: {err.msg}; write a JSON object "
                     "(double-quoted keys, no trailing commas)", file=doc.file, line=el.sourceline + offset,
                     column=err.colno if offset else None, element_id=owner_id)
            return _NO_JSON

    def _extension_config(self, doc: _Doc, owner_id: str, parts: list[tuple[int, Any, int]]) -> None:
        """Both extension elements of one element merge key by key (the own namespace wins), then validate once."""
        for _, data, line in parts:
            if not isinstance(data, dict):  # a JSON list or string: config_from_dict says what it must be
                self._validate_config(data, doc.file, owner_id, lambda *_, _line=line: _line)
                return
        merged: dict[str, Any] = {}
        for _, data, _ in parts:
            merged.update(data)

        def line_of(*path: Any) -> int | None:
            top = str(path[0]) if path else None
            return next((line for _, data, line in reversed(parts) if top in data), parts[-1][2])

        config = self._validate_config(merged, doc.file, owner_id, line_of)
        if config is not None:
            self.sources.append(_Source(owner_id, doc.file, config, line_of))

    def _validate_config(self, data: Any, file: str, element_id: str,
                         line_of: Callable[..., int | None]) -> ActivityExtensionConfig | None:
        try:
            return config_from_dict(data, source=file, element_id=element_id)
        except ConfigError as err:
            for p in err.problems:
                field_path = p.get("field") or "(config)"
                self.add("invalid_config_field", _config_message(p.get("message", "")), file=file,
                         line=line_of(*field_path.split(".")), element_id=element_id, field=field_path)
            return None

    def _check_config_file(self, config: ProcessConfigFile, main: str | None) -> None:
        file = str(config.path)
        scope = f"process {main!r}" if main else (
            "processes " + ", ".join(repr(p.id) for p in self.processes) if self.processes else self._files())
        checkable = any(d.root is not None for d in self.docs)
        for eid in config.element_ids:
            line = config.line_of(eid)
            if eid == main and self.pools:
                self._check_collaboration_config(config, eid, file)
                continue
            if eid not in self.nodes and checkable:
                other = self.other_ids.get(eid)
                if other is not None:
                    self._not_a_flow_node(eid, other.tag, file, line)
                    continue
                known = sorted(self.nodes)
                hint = _section_meant(eid) or _did_you_mean(eid, known)
                if not hint:
                    shown = ", ".join(repr(k) for k in known[:12]) + (", ..." if len(known) > 12 else "")
                    hint = f"; ids present: {shown}" if known else ""
                self.add("unknown_element_id", f"config for an id that does not exist in {scope}{hint}; "
                         "fix the id or remove the entry", file=file, line=line, element_id=eid)
                continue
            cfg = config.elements.get(eid) or config.partial.get(eid)
            if cfg is not None:
                self.sources.append(_Source(eid, file, cfg, lambda *path, _e=eid: config.line_of(_e, *path)))

    def _check_collaboration_config(self, config: ProcessConfigFile, eid: str, file: str) -> None:
        """The config of the collaboration that runs: its ``branches`` are its pools (each one's
        ``contextInject`` goes into that pool's context as it starts), its join settings those of its
        end join, where the pools' contexts merge (``engine.collaboration``)."""
        cfg = config.elements.get(eid)
        if cfg is None:
            return
        self.sources.append(_Source(eid, file, cfg, lambda *path, _e=eid: config.line_of(_e, *path)))
        for i, branch in enumerate(cfg.branches):
            if branch.id not in self.pools:
                self.add("branch_not_outgoing", f"branch {branch.id!r} of collaboration {eid!r} is no pool that "
                         f"runs{_did_you_mean(branch.id, list(self.pools))}; a collaboration's branches are its "
                         f"pools, named by their process ids: {', '.join(map(repr, self.pools))}", file=file,
                         line=config.line_of(eid, "branches", i, "id"), element_id=eid, field=f"branches.{i}.id")
        for i, bid in enumerate(cfg.branch_priority):
            if bid not in self.pools:
                self.add("branch_priority_unknown_id", f"branchPriority names {bid!r}, which is no pool of collaboration "
                         f"{eid!r} that runs{_did_you_mean(bid, list(self.pools))}; list its pools' process ids: "
                         f"{', '.join(map(repr, self.pools))}", file=file, line=config.line_of(eid, "branchPriority", i),
                         element_id=eid, field=f"branchPriority.{i}")

    def _not_a_flow_node(self, eid: str, tag: str, file: str, line: int | None) -> None:
        hint = ("; SpiffWorkflow ignores extensions on sequence flows: put per-branch settings in the "
                "gateway's branches (id = the flow's target)" if tag == "sequenceFlow" else
                "; process-level options go under process: in the config file" if tag == "process" else
                "; layerflow reads a collaboration's options (its pools' branches, its end join's mergeStrategy) "
                f"from the config file only: put them under '{eid}:' in the config file" if tag == "collaboration"
                else "")
        self.add("config_not_a_flow_node", f"{eid!r} is a bpmn:{tag}, not a task, event or gateway; "
                 f"activity config applies only to those{hint}", file=file, line=line, element_id=eid)

    def _check_merges(self) -> None:
        by_id: dict[str, list[_Source]] = {}
        for src in self.sources:
            by_id.setdefault(src.element_id, []).append(src)
        for eid, sources in by_id.items():
            merged = sources[0].config
            for src in sources[1:]:
                try:
                    merged = merged.merged_with(src.config)
                except ValidationError as err:
                    for p in _pydantic_problems(err):
                        self.add("config_merge_invalid", f"together with the BPMN extension config: "
                                 f"{_config_message(p['message'])}", file=src.file, line=src.line_of(),
                                 element_id=eid, field=p["field"])
                    break
            else:
                self.merged[eid] = merged

    def _check_handlers(self) -> None:
        """``handler: file.py:function`` / ``module:function`` that cannot be found: the run would fail
        at that activity, after the ones before it ran. Checked without running the handler's code
        (the file is parsed, the module looked up); a plain name is a runtime registration."""
        base = self.paths[0].resolve().parent if self.paths else Path.cwd()
        for src in self.sources:
            ref = src.config.handler
            if not isinstance(ref, str) or ":" not in ref:
                continue
            module_ref, _, attr = ref.rpartition(":")
            problem = _handler_problem(module_ref, attr, base)
            if problem:
                self.add("handler_not_found", f"handler {ref!r}: {problem}", file=src.file,
                         line=src.line_of("handler"), element_id=src.element_id, field="handler")

    def _check_handlers_run(self) -> None:
        """A handler or an ``llm:`` block for an element that is run, not worked (a send or receive task
        sends or waits for its message, a call activity or sub-process runs its steps): layerflow runs
        none there, and the step it should do never happens, silently."""
        for src in self.sources:
            node = self.nodes.get(src.element_id)
            if node is None or node.tag not in _NOT_WORKED or not (src.config.handler or src.config.llm is not None):
                continue
            what, instead = _NOT_WORKED[node.tag]
            field = "handler" if src.config.handler else "llm"
            self.add("handler_not_run", f"{node.id!r} is a bpmn:{node.tag}, which {what} and runs no handler or "
                     f"llm: block, so its {field} never runs; {instead}", file=src.file, line=src.line_of(field),
                     element_id=src.element_id, field=field)

    def _check_branches(self) -> None:
        for src in self.sources:
            node = self.nodes.get(src.element_id)
            if node is None:
                continue
            cfg = src.config
            if cfg.branches and not node.tag.endswith("Gateway"):
                self.add("branches_on_non_gateway", f"branches apply to split gateways, and {node.id!r} is a "
                         f"bpmn:{node.tag}; move them to the gateway's config", file=src.file,
                         line=src.line_of("branches"), element_id=src.element_id, field="branches")
            elif cfg.branches:
                flows = _outgoing(node.element)
                targets = [f.get("targetRef") for f in flows]
                if len(flows) == 1:
                    self.add("branches_ignored", f"gateway {node.id!r} has one outgoing flow, so it splits nothing "
                             "and its branches (their contextInject and condition) are never used; configure them "
                             "on the gateway where the paths split", file=src.file, line=src.line_of("branches"),
                             element_id=src.element_id, field="branches", severity="warning")
                by_flow = {f.get("id"): f.get("targetRef") for f in flows}
                for i, branch in enumerate(cfg.branches if len(flows) > 1 else ()):
                    if branch.id in targets:
                        continue
                    if branch.id in by_flow:
                        hint = (f"; {branch.id!r} is the flow itself: use its target {by_flow[branch.id]!r} "
                                "(a branch is named by its first element)")
                    else:
                        hint = _did_you_mean(branch.id, targets) or ""
                        hint += f"; the outgoing flows lead to {', '.join(repr(t) for t in targets) or 'nothing'}"
                    self.add("branch_not_outgoing", f"branch {branch.id!r} is not the target of an outgoing flow "
                             f"of gateway {node.id!r}{hint}", file=src.file,
                             line=src.line_of("branches", i, "id"), element_id=src.element_id,
                             field=f"branches.{i}.id")
            for i, bid in enumerate(cfg.branch_priority):
                if _instance_id_of(bid, node) is not None:
                    continue  # an instance of this parallel multi-instance scope (``ACTIVITY#N``)
                if bid not in self.nodes:
                    self.add("branch_priority_unknown_id", f"branchPriority names {bid!r}, which is no element of "
                             f"the process{_did_you_mean(bid, sorted(self.nodes))}; list the ids of the branches' "
                             "first elements", file=src.file, line=src.line_of("branchPriority", i),
                             element_id=src.element_id, field=f"branchPriority.{i}")
                elif not _may_begin_branch(self.nodes[bid].element):
                    starts = _branch_starts(node.element)
                    listed = f" (here: {', '.join(map(repr, starts))})" if starts else ""
                    self.add("branch_priority_not_a_branch", f"branchPriority names {bid!r}, which begins no "
                             "branch: no split's outgoing flow leads to it, so the join never meets it among its "
                             "branches; list the ids of the branches' first elements, the targets of the split's "
                             f"outgoing flows{listed}", file=src.file, line=src.line_of("branchPriority", i),
                             element_id=src.element_id, field=f"branchPriority.{i}", severity="warning")
            merged = self.merged.get(src.element_id, cfg)
            if (cfg.branch_priority and cfg.branch_priority == merged.branch_priority
                    and merged.merge_strategy != "BRANCH_PRIORITY"):
                self.add("branch_priority_unused", f"branchPriority {list(cfg.branch_priority)} decides nothing: "
                         f"only mergeStrategy BRANCH_PRIORITY reads it, and {src.element_id!r} merges with "
                         f"{merged.merge_strategy}; write mergeStrategy: BRANCH_PRIORITY beside it to let the "
                         "listed branches settle conflicts, or remove branchPriority", file=src.file,
                         line=src.line_of("branchPriority"), element_id=src.element_id, field="branchPriority",
                         severity="warning")

    def _check_injects(self, config: ProcessConfigFile | None) -> None:
        """A contextInject of a key the config fixes in SYSTEM (``system:``) is refused at the
        split (the run would stop there); one of a split's own markers (``_branch_id``,
        ``_snapshot_id``) is overwritten by the split."""
        system = config.system if config is not None else {}
        for src in self.sources:
            for i, branch in enumerate(src.config.branches):
                for key in branch.context_inject:
                    if key in system:
                        why, severity = ("which the config's system: fixes in L0 SYSTEM: the split would refuse it "
                                         "and stop the instance", "error")
                    elif key in _SPLIT_MARKERS:
                        why, severity = ("which the split sets itself (the branch's id, the split's snapshot) over "
                                         "the injected value", "warning")
                    else:
                        continue
                    self.add("inject_fixed_key", f"branch {branch.id!r} injects {key!r}, {why}; inject a different "
                             "key", file=src.file, line=src.line_of("branches", i, "contextInject", key),
                             element_id=src.element_id, field=f"branches.{i}.contextInject.{key}",
                             severity="error" if severity == "error" else "warning")

    def _check_model_limits(self, config: ProcessConfigFile | None) -> None:
        """SYSTEM's ``model_limits`` bound every model request (``engine.llm.ModelLimits``): one that
        cannot would fail the first model step of every run."""
        from .model_limits import MODEL_LIMITS_KEY, ModelLimits, ModelLimitsError

        if config is None or MODEL_LIMITS_KEY not in config.system:
            return
        try:
            ModelLimits.parse(config.system[MODEL_LIMITS_KEY])
        except ModelLimitsError as err:
            self.add("model_limits", str(err).removeprefix("no model request was sent: "),
                     file=str(config.path) if config.path else None, line=config.line_of("system", MODEL_LIMITS_KEY),
                     field=f"system.{MODEL_LIMITS_KEY}")

    def _check_policy_rules(self) -> None:
        """A ``conflictPolicy`` rule's ``when`` is checked where it runs, at the join, when a
        conflict on its key comes: one it cannot evaluate would stop the instance there."""
        from gateways.expressions import ExpressionError, check_expression

        for src in self.sources:
            policy = src.config.conflict_policy
            for i, rule in enumerate(policy.rules if policy is not None else ()):
                try:
                    check_expression(rule.when)
                except ExpressionError as err:
                    self.add("policy_rule_expression", f"conflictPolicy rule {i} (key {rule.key!r}): its when "
                             f"{rule.when!r} cannot be evaluated: {err}; write a Python expression over the "
                             "context (e.g. risk_level == \"high\" and amount > 100000)", file=src.file,
                             line=src.line_of("conflictPolicy", "rules", i, "when"), element_id=src.element_id,
                             field=f"conflictPolicy.rules.{i}.when")

    def _check_confirm_defaults(self) -> None:
        """A join's one ``humanConfirm.default`` is offered, and taken on timeout, only for conflicts whose
        values are of its type (``gateways.policy.default_fits``). When the join's config says of which
        types its values are (``conflictPolicy`` rankings and rule values, ``humanConfirm`` options) and
        the default is of none of them, it may never apply: the timeout escalates where the designer
        expected the default. A key's own default (``humanConfirm.defaults``) is judged the same way
        against what the config says of that key (its ranking, the rules that may name it, the options);
        the rankings and rules of a key listed there say nothing of the join's one ``default``."""
        from gateways.policy import ESCALATE

        for src in self.sources:
            hc = src.config.human_confirm
            if hc is None:
                continue
            if hc.default is not None and hc.default != ESCALATE:
                declared = self._declared_forms(src, None)
                self._default_unfit(src, hc.default, declared, "humanConfirm.default", ("humanConfirm", "default"))
            for key, default in hc.defaults.items():
                if default == ESCALATE:
                    continue
                declared = self._declared_forms(src, key)
                self._default_unfit(src, default, declared, f"humanConfirm.defaults.{key}",
                                    ("humanConfirm", "defaults", key))

    @staticmethod
    def _declared_forms(src: _Source, for_key: str | None) -> dict[str, set[str]]:
        """The JSON types of the values a join's config names (type -> where): ``conflictPolicy``
        rankings and rule values, and ``humanConfirm`` options (any key's). ``for_key``: only the
        rankings and rules that may be about that key; None: those of the keys the join's one
        ``default`` serves (every key not listed in ``humanConfirm.defaults``)."""
        from gateways.strategies import json_type

        hc, policy = src.config.human_confirm, src.config.conflict_policy
        listed = hc.defaults if hc is not None else {}

        def about(name: str) -> bool:
            if for_key is None:
                return name not in listed
            return name == for_key or fnmatch.fnmatchcase(for_key, name)

        declared: dict[str, set[str]] = {}
        for key, ranking in (policy.rankings.items() if policy is not None else ()):
            if about(key):
                for value in ranking:
                    declared.setdefault(json_type(value), set()).add(f"the ranking of {key!r}")
        for rule in (policy.rules if policy is not None else ()):
            if about(rule.key):
                declared.setdefault(json_type(rule.value), set()).add(f"the rule for {rule.key!r}")
        for option in [*(hc.options if hc else ()), *(hc.extra_options if hc else ())]:
            value = option.get("value") if isinstance(option, dict) and "value" in option else option
            declared.setdefault(json_type(value), set()).add("humanConfirm options")
        return declared

    def _default_unfit(self, src: _Source, default: Any, declared: dict[str, set[str]], field: str,
                       path: tuple[str, ...]) -> None:
        from gateways.strategies import json_type

        form = json_type(default)
        if not declared or form in declared:
            return
        listed = "; ".join(f"{kind}: {', '.join(sorted(where))}" for kind, where in sorted(declared.items()))
        which = "this join's config names" if field == "humanConfirm.default" else \
            f"this join's config names for key {path[-1]!r}"
        self.add("human_confirm_default_unfit", f"{field} {default!r} is a {form}, and the values "
                 f"{which} are of other types ({listed}); the default is offered, and taken "
                 "when the timeout runs out, only for a conflict whose values are of its type, so here the "
                 "timeout may fall back on the suggestion or escalate instead: give a default of the values' "
                 "type, or remove it", file=src.file, line=src.line_of(*path),
                 element_id=src.element_id, field=field, severity="warning")

    def _check_join_fields(self) -> None:
        """Join settings where no join reads them: a designer who put ``mergeStrategy:
        FAIL_ON_CONFLICT`` on the split (or on a task) would see conflicts go to people."""
        for src in self.sources:
            node = self.nodes.get(src.element_id)
            # only where it is plain that nothing joins: a task or event, or a gateway that
            # splits one incoming flow (the designer's likely slip: the split for the join)
            if node is None or (node.tag.endswith("Gateway") and not (
                    len(_incoming(node.element)) <= 1 < len(_outgoing(node.element)))):
                continue
            if _parallel_multi_scope(node):
                continue  # its instances merge as a join's branches do (ScopeSteps._merge_instance)
            cfg = src.config
            fields = [name for name, value in (
                ("mergeStrategy", cfg.merge_strategy != "MERGE_WITH_CONFLICT_DETECT"),
                ("branchPriority", bool(cfg.branch_priority)), ("reducers", bool(cfg.reducers)),
                ("conflictPolicy", cfg.conflict_policy is not None),
            ) if value]
            joins = sorted(n.id for n in self.nodes.values()
                           if n.tag in _JOIN_TAGS and len(_incoming(n.element)) > 1)
            where = f" (the joins of the process: {', '.join(map(repr, joins))})" if joins else ""
            for name in fields:
                self.add("join_config_on_non_join", f"{name} applies at a join (a parallel or inclusive gateway "
                         f"with several incoming flows), and {node.id!r} is a bpmn:{node.tag} that joins nothing, "
                         f"so it is ignored here; move it to the join's config{where}", file=src.file,
                         line=src.line_of(name), element_id=src.element_id, field=name, severity="warning")

    def _check_scope_fields(self) -> None:
        """Compression and retrieval settings on a sub-process or call activity: nothing of it is an
        activity that retrieves, and compression is checked after its steps, by their own configs
        (after its spiffworkflow:preScript or postScript only, which run as its activity). Its
        ``preserveKeys`` do hold, from its start."""
        for src in self.sources:
            node = self.nodes.get(src.element_id)
            if node is None or node.tag not in ("subProcess", "callActivity", "transaction"):
                continue
            cfg, written = src.config, src.config.model_fields_set | src.config.context_strategy.model_fields_set
            scripted = any((el.text or "").strip() for el in node.element.iter(f"{{{SPIFF_NS}}}preScript",
                                                                             f"{{{SPIFF_NS}}}postScript")
                           if _owner_id(el.getparent()) == node.id)
            fields = [] if scripted else [alias for name, alias in (
                ("compress_token_threshold", "compressTokenThreshold"),
                ("compress_message_threshold", "compressMessageThreshold"),
                ("compress_rules", "compressRules"), ("attention_thresholds", "attentionThresholds")) if name in written]
            if cfg.knowledge_config is not None:
                fields.append("knowledgeConfig")
            for name in fields:
                self.add("scope_config_not_read", f"{name} on {node.id!r}, a bpmn:{node.tag}, is read by nothing: it "
                         "runs the steps inside it, each after its own config (its compression, its retrieval); "
                         f"put {name} on the tasks inside it (preserveKeys on {node.id!r} do hold while it runs)",
                         file=src.file, line=src.line_of(name), element_id=src.element_id, field=name,
                         severity="warning")

    def _check_config_ids(self) -> None:
        """The seed's shape repeats the element id inside the config (``activityId``,
        ``gatewayId``); the element the config is keyed by (or attached to) is the one it
        configures, so another id there is a copy-paste slip worth showing."""
        for src in self.sources:
            for name, value in (("activityId", src.config.activity_id), ("gatewayId", src.config.gateway_id)):
                if value is not None and value != src.element_id:
                    self.add("config_id_mismatch", f"{name} {value!r} is not the id of the element this config "
                             f"applies to ({src.element_id!r}); the config applies to {src.element_id!r}: make "
                             f"{name} {src.element_id!r} or remove it", file=src.file, line=src.line_of(name),
                             element_id=src.element_id, field=name, severity="warning")

    def _check_config_types(self) -> None:
        """The seed's ``type`` repeats what the BPMN draws; the BPMN decides, so a ``type`` that
        says otherwise is a config copied from another gateway (its branches, its join settings)."""
        for src in self.sources:
            declared = src.config.type
            node = self.nodes.get(src.element_id)
            if not declared or node is None:
                continue
            kind, _, role = declared.strip().upper().rpartition("_")
            if role not in ("SPLIT", "JOIN") or kind not in _SEED_GATEWAY_KINDS:
                if node.tag.endswith("Gateway"):
                    self.add("config_type_mismatch", f"type {declared!r} is none of the seed's gateway types "
                             f"(XOR_SPLIT, AND_JOIN, ...; kinds {', '.join(sorted(_SEED_GATEWAY_KINDS))}); "
                             f"{src.element_id!r} is a bpmn:{node.tag}: correct the type or remove it",
                             file=src.file, line=src.line_of("type"), element_id=src.element_id, field="type",
                             severity="warning")
                continue
            problems = []
            if node.tag != _SEED_GATEWAY_KINDS[kind]:
                problems.append(f"a bpmn:{_SEED_GATEWAY_KINDS[kind]}, but {src.element_id!r} is a bpmn:{node.tag}")
            splits, joins = len(_outgoing(node.element)) > 1, len(_incoming(node.element)) > 1
            if role == "SPLIT" and joins and not splits or role == "JOIN" and splits and not joins:
                drawn = "joins" if joins else "splits"
                problems.append(f"a {role.lower()}, but {src.element_id!r} {drawn} its flows")
            if problems:
                self.add("config_type_mismatch", f"type {declared!r} says {' and '.join(problems)}; the BPMN "
                         f"decides how it runs: is this config meant for another element? Correct the type or "
                         f"remove it", file=src.file, line=src.line_of("type"), element_id=src.element_id,
                         field="type", severity="warning")

    def _check_knowledge(self) -> None:
        root = (self.paths[0].resolve().parent if self.paths else Path.cwd()) / "knowledge"
        available = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        for src in self.sources:
            kc = src.config.knowledge_config
            if kc is None:
                continue
            if kc.query:
                self._check_query_template(src, kc.query)
            for i, name in enumerate(kc.rag_collections):
                folder = root / name
                if folder.is_dir() and any(p.suffix in (".md", ".txt") for p in folder.iterdir()):
                    continue
                what = "has no .md or .txt file" if folder.is_dir() else "does not exist"
                self.add("knowledge_collection_not_found", f"ragCollections names {name!r}, but {folder} {what}, "
                         f"so the default retriever finds nothing for it{_did_you_mean(name, available)}; put "
                         "the collection's documents there or fix the name (an Engine given its own retriever "
                         "may serve it)", file=src.file, line=src.line_of("knowledgeConfig", "ragCollections", i),
                         element_id=src.element_id, field=f"knowledgeConfig.ragCollections.{i}", severity="warning")

    def _check_query_template(self, src: Any, query: str) -> None:
        """A retrieval query is a template of context keys (``{industry}``); one that does not parse
        is sent as written, braces and all (a runtime config change refuses it)."""
        import string

        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(query) if f is not None]
        except ValueError as err:
            problem: str | None = f"is not a template ({err}): it is sent as written, braces and all"
        else:
            empty = [f for f in fields if not f]
            reach = [f for f in fields if "." in f or "[" in f]
            problem = ("has an empty field {}: the query is sent as written, braces and all" if empty else
                       f"reads {reach[0]!r}, an attribute or item of a value's Python object, not a context key"
                       if reach else None)
        if problem is not None:
            self.add("knowledge_query_template", f"knowledgeConfig.query {query!r} {problem}; write {{key}} for each "
                     "context key the query should hold",
                     file=src.file, line=src.line_of("knowledgeConfig", "query"), element_id=src.element_id,
                     field="knowledgeConfig.query", severity="warning")

    # -- gateways and scripts --------------------------------------------------------------

    def _branch_condition(self, gateway_id: str, branch_id: str | None) -> str | None:
        """The condition the (merged) config of a gateway gives one of its branches."""
        cfg = self.merged.get(gateway_id)
        for branch in (cfg.branches if cfg is not None else []):
            if branch.id == branch_id and branch.condition and branch.condition.strip():
                return str(branch.condition.strip())
        return None

    def _check_gateways(self, proc: _Node) -> None:
        for gw in proc.element.iter(_bpmn("exclusiveGateway")):
            gid = gw.get("id") or "(no id)"
            file = proc.file
            flows = _outgoing(gw)
            default = gw.get("default")
            flow_ids = [f.get("id") for f in flows]
            if default and default not in flow_ids:
                self.add("gateway_default_invalid", f"default={default!r} is not an outgoing flow of gateway "
                         f"{gid!r}{_did_you_mean(default, flow_ids)}; outgoing flows: "
                         f"{', '.join(repr(f) for f in flow_ids) or 'none'}", file=file, line=gw.sourceline,
                         element_id=gid, field="default")
                default = None
            if not flows:
                continue
            if len(flows) == 1 and not _condition_text(flows[0]) and default is None:
                continue  # a pass-through (merging) gateway: SpiffWorkflow takes its one flow as default
            conditions: list[ast.expr] = []
            judged = True
            for flow in flows:
                if flow.get("id") == default:
                    continue
                expr = _condition_text(flow)
                configured = self._branch_condition(gid, flow.get("targetRef"))
                if not expr and configured is not None:
                    # the config's condition for this branch stands in for the missing expression
                    # (``spiff.LayerflowBpmnParser`` gives it to the flow)
                    judged = False
                    if is_flow_sentence(configured):
                        self.add("condition_natural_language", f"flow {flow.get('id')!r} of gateway {gid!r} has no "
                                 f"conditionExpression; the config's sentence for branch {flow.get('targetRef')!r} "
                                 "is its condition: the model decides it (--model or the gateway's llm.model); "
                                 "without a model, or when the model fails, the flow is not taken and the "
                                 "expressions or the default flow decide", file=file, line=flow.sourceline,
                                 element_id=flow.get("id"), field="conditionExpression", severity="warning")
                    else:
                        try:
                            compile(configured, f"<condition of branch {flow.get('targetRef')}>", "eval")
                        except SyntaxError as err:
                            self.add("condition_syntax", f"the config's condition for branch "
                                     f"{flow.get('targetRef')!r} of gateway {gid!r} (flow {flow.get('id')!r} has "
                                     f"none of its own) is neither a sentence nor a valid Python expression: "
                                     f"{err.msg}; write a sentence or an expression", file=file, line=gw.sourceline,
                                     element_id=gid, field="branches.condition")
                    continue
                if not expr:
                    elsewhere = _written_elsewhere(flow, "condition")
                    self.add("gateway_flow_without_condition", f"outgoing flow {flow.get('id')!r} of gateway {gid!r} "
                             f"(to {flow.get('targetRef')!r}) has no condition and is not the default flow; add a "
                             f"conditionExpression{f' ({elsewhere})' if elsewhere else ''} or set "
                             f"default=\"{flow.get('id')}\" on the gateway",
                             file=file, line=flow.sourceline, element_id=flow.get("id"), field="conditionExpression")
                    judged = False
                    continue
                expr_el = flow.find(_bpmn("conditionExpression"))
                if is_flow_sentence(expr):
                    spaced = _spaced_names_instead(expr.strip())
                    meant = (f" (if it is meant as an expression: {_spaced_names_said(*spaced)})"
                             if spaced is not None and _compares_values(spaced[1]) else "")
                    self.add("condition_natural_language", f"the condition of flow {flow.get('id')!r} of gateway "
                             f"{gid!r} is a sentence, not an expression: the model decides it (--model or the "
                             "gateway's llm.model); without a model, or when the model fails, the flow is not "
                             f"taken and the expressions or the default flow decide{meant}", file=file,
                             line=expr_el.sourceline if expr_el is not None else flow.sourceline,
                             element_id=flow.get("id"), field="conditionExpression", severity="warning")
                    judged = False
                    continue
                tree = self._compile(expr_el.text, "eval", expr_el, file, flow.get("id"),
                                     "condition_syntax", "conditionExpression")
                if not isinstance(tree, ast.Expression):
                    judged = False
                    continue
                if self._check_probability(tree, expr_el, flow, gid, file):
                    judged = False
                    continue
                conditions.append(tree.body)
            if default is not None or not judged:
                continue
            gap = coverage_gap(conditions)
            if gap is not None:
                # only a gap that is certain is an error (see ``CoverageGap.certain``): the process still runs
                self.add(gap.code, f"exclusive gateway {gid!r} has no default flow and its conditions {gap.text}; "
                         f"when no condition holds the instance fails: add a default flow (default=\"FLOW_ID\") "
                         "or a condition for the missing values", file=file, line=gw.sourceline,
                         element_id=gid, field="default", severity="error" if gap.certain else "warning")
        for gw in proc.element.iter(_bpmn("inclusiveGateway")):
            self._check_inclusive_flows(gw, proc.file)
            self._check_inclusive_coverage(gw, proc.file)

    def _check_probability(self, tree: ast.Expression, expr_el: Any, flow: Any, gid: str, file: str) -> bool:
        """A condition that is a bare number is the branch's probability, as simulation tools
        (Signavio's, Bizagi's) export it, not a test of the data: Python takes any number but 0 as
        true, so every instance would take the first such flow. True when it was refused."""
        body = tree.body
        if isinstance(body, ast.UnaryOp) and isinstance(body.op, (ast.UAdd, ast.USub)):
            body = body.operand
        if not (isinstance(body, ast.Constant) and type(body.value) in (int, float)):
            return False
        text = (expr_el.text or "").strip()
        exclusive = any(g.get("id") == gid for g in flow.getparent().iter(_bpmn("exclusiveGateway")))
        taken = ("no instance would take it" if body.value == 0
                 else "every instance would take the first flow of the gateway that has a number" if exclusive
                 else "every instance would take it")
        self.add("condition_probability", f"the condition of flow {flow.get('id')!r} of gateway {gid!r} is the "
                 f"number {text!r}, as simulation tools (Signavio's, Bizagi's) write a branch's probability; it "
                 f"is not a test of the data: Python takes every number but 0 as true, so "
                 f"{taken}, whatever its data; write an expression over the context that decides the branch (e.g. "
                 "approved == True), or make the flow the gateway's default", file=file,
                 line=expr_el.sourceline, element_id=flow.get("id"), field="conditionExpression")
        return True

    def _check_inclusive_flows(self, gw: Any, file: str) -> None:
        """BPMN takes a flow of an inclusive gateway that has no condition always; SpiffWorkflow cannot
        load one that is not the default ("Non-default exclusive outgoing sequence flow without
        condition", naming the first such flow only). Each is named, with the condition to write."""
        flows = _outgoing(gw)
        if len(flows) < 2:
            return  # a join's one flow: SpiffWorkflow takes it as the default
        gid, default = gw.get("id") or "(no id)", gw.get("default")
        for flow in flows:
            fid = flow.get("id")
            if fid == default or _condition_text(flow) or self._branch_condition(gid, flow.get("targetRef")):
                continue
            otherwise = "" if default else f", or set default=\"{fid}\" on the gateway to take it when no other does"
            self.add("gateway_flow_without_condition", f"outgoing flow {fid!r} of inclusive gateway {gid!r} (to "
                     f"{flow.get('targetRef')!r}) has no condition and is not the default flow: BPMN takes such a "
                     "flow always, SpiffWorkflow cannot load it; write <bpmn:conditionExpression>True"
                     "</bpmn:conditionExpression> in it to take it always, a condition to choose it"
                     f"{otherwise}", file=file, line=flow.sourceline, element_id=fid, field="conditionExpression")

    def _check_inclusive_coverage(self, gw: Any, file: str) -> None:
        """An inclusive gateway that takes no flow fails as an exclusive one does: the same gap,
        a warning here (it ran before this check was written; its conditions are the designer's)."""
        flows = _outgoing(gw)
        if gw.get("default") or len(flows) < 2:
            return
        conditions: list[ast.expr] = []
        for flow in flows:
            text = _condition_text(flow)
            source = python_source(text) if text else None
            if source is None:
                return  # no condition (reported elsewhere), or one that does not parse (condition_syntax)
            conditions.append(ast.parse(source, mode="eval").body)
        gap = coverage_gap(conditions)
        if gap is not None:
            gid = gw.get("id") or "(no id)"
            self.add(gap.code, f"inclusive gateway {gid!r} has no default flow and its conditions {gap.text}; "
                     "when no condition holds it takes no flow and the instance fails there: add a default flow "
                     "(default=\"FLOW_ID\") or a condition for the missing values", file=file, line=gw.sourceline,
                     element_id=gid, field="default", severity="warning")

    def _check_exclusive_into_parallel(self, proc: _Node) -> None:
        """Two incoming flows of a parallel join that go back, step by step through plain nodes, to
        different flows of one exclusive (or event-based) gateway: only one of them ever carries a
        token, and the join waits for the other for ever (the run then stops there)."""
        for join in proc.element.iter(_bpmn("parallelGateway")):
            incoming = _incoming(join)
            if len(incoming) < 2:
                continue
            origins: dict[str, set[str]] = {}
            for flow in incoming:
                found = _choice_behind(flow)
                if found is not None:
                    origins.setdefault(found[0], set()).add(found[1])
            for choice, branches in origins.items():
                if len(branches) < 2:
                    continue
                jid = join.get("id") or "(no id)"
                self.add("join_never_complete", f"parallel gateway {jid!r} joins flows that come from different "
                         f"paths of {choice!r}, which takes only one of them: the join waits for the others for ever "
                         f"and the instance stops there; merge them in an exclusive gateway instead (or make "
                         f"{choice!r} a parallel or inclusive split)", file=proc.file, line=join.sourceline,
                         element_id=jid, severity="warning")
                break

    def _check_reentered_joins(self, proc: _Node) -> None:
        """A parallel join whose section (the nodes on the paths from a parallel split to it) a loop
        enters again from after the join, not through the split: SpiffWorkflow's parallel_join_in_loop
        shape (a second split feeding the branches), or a flow back into one branch. The join then gets
        tokens that no one split sent together. A loop round the whole pair, or inside one branch, is fine."""
        for scope in (proc.element, *proc.element.iter(*_SCOPES)):
            nodes = {n.get("id"): n for n in scope.iterchildren() if n.tag in _FLOW_NODES and n.get("id")}
            edges: list[tuple[str, str, str]] = [(f.get("sourceRef"), f.get("id") or "(no id)", f.get("targetRef"))
                                                 for f in scope.iterchildren(_bpmn("sequenceFlow"))]
            for nid, n in nodes.items():
                if n.get("attachedToRef") in nodes:  # a boundary event continues its activity's path
                    edges.append((n.get("attachedToRef"), nid, nid))
                edges += [(nid, nid, c.get("id")) for c in _jump_targets(n)]
            after: dict[str, list[str]] = {}
            before: dict[str, list[str]] = {}
            for src, _, dst in edges:
                after.setdefault(src, []).append(dst)
                before.setdefault(dst, []).append(src)

            def reach(start: str, step: dict[str, list[str]], stop: str) -> set[str]:
                seen: set[str] = set()
                todo = list(step.get(start, []))
                while todo:
                    nid = todo.pop()
                    if nid in seen or nid == stop or nid not in nodes:
                        continue
                    seen.add(nid)
                    if nid != start:
                        todo.extend(step.get(nid, []))
                return seen

            parallel = [i for i, n in nodes.items() if n.tag == _bpmn("parallelGateway")]
            splits = [i for i in parallel if len(after.get(i, [])) > 1]
            for jid in (i for i in parallel if len(before.get(i, [])) > 1):
                for sid in (s for s in splits if s != jid):
                    section = (reach(sid, after, jid) & reach(jid, before, sid)) - {sid, jid}
                    if sum(1 for t in after[sid] if t == jid or t in section) < 2:
                        continue  # the split's branches do not meet at this join
                    if any(jid not in reach(sid, after, inner) for inner in section
                           if inner in parallel and len(before.get(inner, [])) > 1):
                        # every path from the split to this join passes an inner join, which joins the
                        # split's branches first: a mixed gateway that joins a loop and splits again
                        # (SpiffWorkflow's Parallel-Looping-After-Join) is no join of this split
                        continue
                    later = reach(jid, after, sid) | {jid}
                    back = [fid for src, fid, dst in edges
                            if dst in section and src in later and src not in section and src != sid]
                    if not back:
                        continue
                    join = nodes[jid]
                    shown = ", ".join(map(repr, back))
                    self.add("join_reentered_in_loop", f"parallel gateway {jid!r} joins the branches of split "
                             f"{sid!r}, and the loop back through {shown} enters those branches again from after the "
                             f"join without passing {sid!r}: the join then gets tokens that no one split sent together, "
                             "and the run stops there (or fires it short) after running the wrong steps; move the flow "
                             f"back to an exclusive gateway in front of {sid!r}, so each pass goes through the split, "
                             "or give a second split a join of its own", file=proc.file, line=join.sourceline,
                             element_id=jid, severity="warning")
                    break

    def _check_token_quantities(self, proc: _Node) -> None:
        """An activity's startQuantity (the tokens its incoming flows must bring before it starts) or
        completionQuantity (the tokens it sends down each outgoing flow) other than 1, as modelers
        and simulation tools write (MIWG C.3.0: 2 and 2). SpiffWorkflow reads neither: the activity
        runs once per arriving token and sends one on, so what the number asks for never happens."""
        for el in proc.element.iter(*_FLOW_NODES):
            asked = [(attr, el.get(attr)) for attr in ("startQuantity", "completionQuantity")
                     if el.get(attr) is not None and el.get(attr).strip() != "1"]
            if not asked:
                continue
            eid = el.get("id") or "(no id)"
            what = {"startQuantity": "to wait for that many tokens on its incoming flows before it starts",
                    "completionQuantity": "to send that many tokens down each outgoing flow, running what follows "
                                          "that many times"}
            said = "; ".join(f"{attr}={value!r} asks it {what[attr]}" for attr, value in asked)
            named = " and ".join(attr for attr, _ in asked)
            self.add("token_quantity", f"bpmn:{etree.QName(el).localname} {eid!r}: {said}, which SpiffWorkflow "
                     f"ignores: it runs the step once for each token that arrives and sends one token on; remove "
                     f"{named} (or set {'them' if len(asked) > 1 else 'it'} to 1), and draw what the number meant: "
                     "a parallel gateway to send several tokens, a parallel join to wait for several, or a "
                     "multi-instance marker to run the step several times", file=proc.file, line=el.sourceline,
                     element_id=eid, field=asked[0][0], severity="warning")

    def _check_split_merges(self, proc: _Node) -> None:
        """Branches of one split that meet before their join (in an exclusive gateway, or a task with
        several incoming flows) go on from there one at a time, so the join fires before all of them
        arrive. Each branch is followed from the split up to the first join (a parallel or inclusive
        gateway with several incoming flows); end events are no merge (the process's end joins)."""
        for scope in (proc.element, *proc.element.iter(*_SCOPES)):
            nodes = {n.get("id"): n for n in scope.iterchildren() if n.tag in _FLOW_NODES}
            after: dict[str, list[str]] = {}
            for f in scope.iterchildren(_bpmn("sequenceFlow")):
                after.setdefault(f.get("sourceRef"), []).append(f.get("targetRef"))
            jumps: dict[str, list[str]] = {}  # a link catch event -> the throws that go on there
            for n in nodes.values():
                if n.get("attachedToRef") in nodes:  # a boundary event continues its activity's branch
                    after.setdefault(n.get("attachedToRef"), []).append(n.get("id"))
                for catch in _jump_targets(n):
                    after.setdefault(n.get("id"), []).append(catch.get("id"))
                    jumps.setdefault(catch.get("id"), []).append(n.get("id"))
            joins = {i for i, n in nodes.items() if etree.QName(n).localname in _JOIN_TAGS and len(_incoming(n)) > 1}
            warned: set[str] = set()
            for sid, split in nodes.items():
                tag = etree.QName(split).localname
                if len(_outgoing(split)) < 2 or tag not in (*_JOIN_TAGS, "startEvent"):
                    continue
                reach: dict[str, set[str]] = {}
                for branch in after.get(sid, []):
                    todo = [branch]
                    while todo:
                        nid = todo.pop()
                        if nid == sid or nid in joins or nid not in nodes or branch in reach.setdefault(nid, set()):
                            continue
                        reach[nid].add(branch)
                        todo.extend(after.get(nid, []))
                for mid, merge in nodes.items():
                    sources = [f.get("sourceRef") for f in _incoming(merge)] + jumps.get(mid, [])
                    kinds = [{mid} if src == sid else reach.get(src, set()) for src in sources]
                    seen = {b for k in kinds for b in k}
                    if (mid in warned or len(sources) < 2 or mid in joins or len(seen) < 2
                            or etree.QName(merge).localname == "endEvent" or all(k == kinds[0] for k in kinds)):
                        continue
                    warned.add(mid)
                    self.add("split_branches_merged", f"bpmn:{etree.QName(merge).localname} {mid!r} merges the "
                             f"branches {', '.join(map(repr, sorted(seen)))} of split {sid!r}, which go on from it one "
                             f"at a time: a join after it may fire before every branch of {sid!r} has arrived (at a parallel "
                             "join layerflow then stops the instance; SpiffWorkflow runs the join again for each late "
                             f"branch); merge them in a parallel gateway instead, or give the join one incoming flow "
                             f"per branch of {sid!r}", file=proc.file, line=merge.sourceline, element_id=mid,
                             severity="warning")

    def _check_references(self, proc: _Node) -> None:
        """Sequence flows that name no element of their scope; call activities that call no loaded process."""
        self._check_node_ids(proc)
        process_ids = [p.id for p in self.processes]
        scopes: dict[Any, list[str]] = {}
        for flow in proc.element.iter(_bpmn("sequenceFlow")):
            scope = flow.getparent()
            if scope not in scopes:
                scopes[scope] = [el.get("id") for el in scope if isinstance(el.tag, str) and el.tag in _FLOW_NODES]
            ids = scopes[scope]
            if not (flow.get("id") or "").strip():
                self.related.update(r for r in (flow.get("sourceRef"), flow.get("targetRef")) if r)
                self.add("flow_id_missing", f"the sequence flow from {flow.get('sourceRef')!r} to "
                         f"{flow.get('targetRef')!r} has no id; SpiffWorkflow keys sequence flows by id and "
                         "follows none without one (the instance would skip everything after it and complete): "
                         'give it an id unique in the file, e.g. id="'
                         f"{flow.get('sourceRef') or 'flow'}_to_{flow.get('targetRef') or 'next'}\"",
                         file=proc.file, line=flow.sourceline, field="id")
            for attr in ("sourceRef", "targetRef"):
                ref = flow.get(attr)
                if ref in ids:
                    continue
                self.related.update(r for r in (flow.get("sourceRef"), flow.get("targetRef")) if r)
                if attr == "sourceRef" and not ref:
                    # what a modeler leaves when the flow's source shape is deleted: nothing can
                    # take the flow, and SpiffWorkflow (which follows flows out of their sources)
                    # runs the process without it
                    self.add("flow_ref_unknown", f"sequence flow {flow.get('id')!r} has no sourceRef, so no "
                             "element leads into it and it is never taken (SpiffWorkflow runs the process without "
                             f"it): remove it, or give it the sourceRef of the element it should leave",
                             file=proc.file, line=flow.sourceline, element_id=flow.get("id"), field=attr,
                             severity="warning")
                    continue
                self.add("flow_ref_unknown", f"sequence flow {flow.get('id')!r} has {attr}={ref!r}, which is no "
                         f"task, event or gateway of this {'process' if scope is proc.element else 'subprocess'}"
                         f"{_did_you_mean(ref or '', ids)}; point it at an existing element",
                         file=proc.file, line=flow.sourceline, element_id=flow.get("id"), field=attr)
        self._check_data_references(proc)
        for call in proc.element.iter(_bpmn("callActivity")):
            called = call.get("calledElement")
            target = next((p for p in self.processes if p.id == called), None)
            if target is not None and not _executable(target.element):
                self.related.add(target.id)
                self.add("call_activity_unknown_process", f"call activity {call.get('id')!r} calls process {called!r} "
                         f"({target.file}:{target.line}), which has isExecutable="
                         f"{target.element.get('isExecutable')!r}: SpiffWorkflow runs no process that is not "
                         "executable, a called one neither; set isExecutable=\"true\" on that process",
                         file=proc.file, line=call.sourceline, element_id=call.get("id"), field="calledElement")
                continue
            if called in process_ids:
                continue
            self.related.add(called or "")
            if called is None:
                self.add("call_activity_unknown_process", f"call activity {call.get('id')!r} has no calledElement"
                         f"{self._called_elsewhere(call)}", file=proc.file,
                         line=call.sourceline, element_id=call.get("id"), field="calledElement")
                continue
            task = next((el for doc in self.docs if doc.root is not None for el in doc.root
                         if isinstance(el.tag, str) and el.get("id") == called
                         and etree.QName(el).localname.startswith("global")), None)
            if task is not None:
                # BPMN lets a call activity call a global task (bpmn:globalTask, globalUserTask, ...);
                # SpiffWorkflow calls processes only
                kind = etree.QName(task).localname
                self.add("call_activity_unknown_process", f"calledElement={called!r} is the bpmn:{kind} of "
                         f"{self._files()}, and SpiffWorkflow's call activity calls a bpmn:process only: draw the "
                         f"task itself in place of call activity {call.get('id')!r}, or make {called!r} a "
                         "bpmn:process (a start event, the task, an end event)", file=proc.file,
                         line=call.sourceline, element_id=call.get("id"), field="calledElement")
                continue
            beside = _defined_beside(called, [Path(d.file) for d in self.docs])
            where = ""
            if beside is not None:  # the command as a shell takes it (a folder may have a space)
                files = [str(f) for f in [*(d.file for d in self.docs), beside]]
                command = " ".join(shlex.quote(f) for f in files)
                where = f" ({beside} defines it: `layerflow run {command}`), in Python `load_process({files!r})`"
            self.add("call_activity_unknown_process", f"calledElement={called!r} is no process of "
                     f"{self._files()}{_did_you_mean(called or '', process_ids)}; add the BPMN file that defines it "
                     f"to the files validated and run{where}, or fix the id", file=proc.file, line=call.sourceline,
                     element_id=call.get("id"), field="calledElement")

    def _check_loops(self, proc: _Node) -> None:
        """A loop of sequence flows that passes no exclusive, inclusive or event-based gateway (a
        flow drawn straight back into a task or an event). SpiffWorkflow predicts the steps ahead of
        a new instance, and stops only at a gateway that decides: on such a loop it predicts without
        end and fails with a RecursionError before the first step runs."""
        deciding = {_bpmn(t) for t in ("exclusiveGateway", "inclusiveGateway", "eventBasedGateway", "complexGateway")}
        for scope in (proc.element, *proc.element.iter(*_SCOPES)):
            nodes = [el.get("id") for el in scope if isinstance(el.tag, str) and el.tag in _FLOW_NODES
                     and el.tag not in deciding and el.get("id")]
            after: dict[str, list[str]] = {n: [] for n in nodes}
            for flow in scope.iterfind(_bpmn("sequenceFlow")):
                source, target = flow.get("sourceRef"), flow.get("targetRef")
                if source in after and target in after:
                    after[source].append(target)
            for throw in scope.iterfind(_bpmn("intermediateThrowEvent")):
                # the engine joins a link throw to its catch as a flow would (engine.links)
                after.get(throw.get("id"), []).extend(c.get("id") for c in _jump_targets(throw)
                                                      if c.get("id") in after)
            cycle = _first_cycle(nodes, after)
            if cycle is None:
                continue
            self.related.update(cycle)
            shown = " -> ".join(repr(n) for n in [*cycle, cycle[0]])
            el = next(e for e in scope if isinstance(e.tag, str) and e.get("id") == cycle[0])
            self.add("loop_without_gateway", f"the flows {shown} make a loop that passes no exclusive, inclusive or "
                     "event-based gateway: SpiffWorkflow cannot start an instance of this process (it predicts the "
                     "loop's steps without end, RecursionError); draw an exclusive gateway where the loop comes "
                     f"back, with the flow into {cycle[0]!r} and the flow back both into it, and a flow from it to "
                     f"{cycle[0]!r}", file=proc.file, line=el.sourceline, element_id=cycle[0])

    def _reached_from(self, main: str) -> set[str]:
        """The process ``main`` and every process its call activities call, at any depth."""
        by_id = {p.id: p for p in self.processes}
        reached, todo = {main}, [main]
        while todo:
            proc = by_id.get(todo.pop())
            for call in proc.element.iter(_bpmn("callActivity")) if proc is not None else ():
                called = call.get("calledElement")
                if called and called not in reached:
                    reached.add(called)
                    todo.append(called)
        return reached

    def _check_recursion(self) -> None:
        """A call activity that starts its own process again, directly or through other called processes,
        with no decision on the way: every instance starts the next one, without end. SpiffWorkflow (whose
        parser once refused any recursive call) then creates called processes until the run is killed."""
        calls: dict[str, list[tuple[Any, str]]] = {}  # process id -> the calls every run of it makes
        for proc in self.processes:
            calls[proc.id] = [(call, call.get("calledElement")) for call in proc.element.iter(_bpmn("callActivity"))
                              if call.get("calledElement") and _always_reached(call, proc.element)]
        reported: set[str] = set()
        for proc in self.processes:
            chain = _call_cycle(proc.id, calls)
            if chain is None or chain[0][0].get("id") in reported:
                continue
            reported.update(call.get("id") for call, _ in chain)
            call, called = chain[0]
            through = " -> ".join([proc.id, *(target for _, target in chain)])
            self.related.add(call.get("id"))
            self.add("call_activity_recursion", f"call activity {call.get('id')!r} calls process {called!r}, and "
                     f"every run of it calls again ({through}) with no gateway, loop or boundary event on the way: "
                     "the calls never end (SpiffWorkflow starts a new instance of the called process at each one and "
                     "the run hangs); put an exclusive gateway with a condition that ends the recursion before the "
                     "call, or call another process", file=proc.file, line=call.sourceline,
                     element_id=call.get("id"), field="calledElement")

    def _check_data_references(self, proc: _Node) -> None:
        """Data associations that name no data object or data store reference: SpiffWorkflow's own
        error for one names an lxml element (``<Element ... at 0x...>``), not the id it missed."""
        root = proc.element.getroottree()
        objects = {el.get("id") for el in root.iter(_bpmn("dataObject"))}
        targets = {el.get("id"): el for tag in ("dataObjectReference", "dataStoreReference")
                   for el in root.iter(_bpmn(tag))}
        # process variables as jBPM saves them: <bpmn:property> of the process, which the context holds by name
        # (and as Yaoqiang saves them: of an event or a task, each an owner's in name only)
        properties = {el.get("id"): el.getparent() for el in proc.element.iter(_bpmn("property"))}
        for tag, attr in (("dataInputAssociation", "sourceRef"), ("dataOutputAssociation", "targetRef")):
            for assoc in proc.element.iter(_bpmn(tag)):
                owner = assoc.getparent().get("id")
                for ref_el in assoc.findall(_bpmn(attr)):
                    ref = (ref_el.text or "").strip()
                    target = targets.get(ref)
                    if target is None and ref in properties:
                        holder = properties[ref]
                        whose = "the process" if holder is proc.element else repr(holder.get("id"))
                        problem = (f"a bpmn:property of {whose} (a process variable, as jBPM saves them), which "
                                   "SpiffWorkflow does not read or write through a data association: the context "
                                   f"holds process variables by name, so remove the association and use {ref!r} by its "
                                   "name (the start data, a script, a form's field), or draw a bpmn:dataObject")
                    elif target is None:
                        problem = (f"which is no dataObjectReference or dataStoreReference of this file"
                                   f"{_did_you_mean(ref, list(targets))}; point it at one")
                    elif target.tag == _bpmn("dataObjectReference") and target.get("dataObjectRef") not in objects:
                        problem = (f"whose dataObjectRef={target.get('dataObjectRef')!r} is no bpmn:dataObject of this "
                                   "file; add that dataObject or fix dataObjectRef")
                    else:
                        continue
                    named = f"{tag} {assoc.get('id')!r}" if assoc.get("id") else f"a {tag}"
                    self.add("data_ref_unknown", f"{named} of {owner!r} has {attr} {ref!r}, {problem}",
                             file=proc.file, line=ref_el.sourceline, element_id=owner, field=attr)
        by_id = {el.get("id"): el for el in root.iter(_bpmn("dataObject"))}
        for assoc in proc.element.iter(_bpmn("dataOutputAssociation")):
            task = assoc.getparent()
            script = task.find(_bpmn("script")) if task.tag == _bpmn("scriptTask") else None
            if task.tag in (_bpmn("userTask"), _bpmn("serviceTask"), _bpmn("manualTask"), _bpmn("task")):
                self._check_data_object_set_by_work(assoc, task, targets, by_id, proc.file)
                continue
            if script is None or not (script.text or "").strip():
                continue
            try:
                tree = ast.parse(script.text)
            except SyntaxError:
                continue  # named as script_syntax
            assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for obj_id, name in _named_apart(assoc, targets, by_id):
                if name not in assigned or obj_id in assigned:
                    continue
                self.add("data_object_named_apart", f"script task {task.get('id')!r} sets {name!r}, the name of "
                         f"the data object it writes (its dataOutputAssociation), but SpiffWorkflow keys a data "
                         f"object by its id, {obj_id!r}: the task's end would stop with \"A data object could not "
                         f"be set\"; give the bpmn:dataObject id=\"{name}\" (and its references "
                         f"dataObjectRef=\"{name}\"), or set {obj_id} in the script", file=proc.file,
                         line=assoc.sourceline, element_id=task.get("id"), field="dataOutputAssociation")

    def _check_data_object_set_by_work(self, assoc: Any, task: Any, targets: Mapping[str, Any],
                                       by_id: Mapping[str, Any], file: str) -> None:
        """A task whose work no script shows (a person's form, a handler) writes a data object that
        the diagram names apart from its id (bpmn-js 6 named the reference and left the dataObject
        unnamed): the work must set the id, which nobody reading the diagram sees. A warning: a
        form or handler may set it."""
        for obj_id, name in _named_apart(assoc, targets, by_id):
            kind = etree.QName(task.tag).localname
            self.add("data_object_named_apart", f"{kind} {task.get('id')!r} writes the data object {name!r} (its "
                     f"dataOutputAssociation), but SpiffWorkflow keys a data object by its id, {obj_id!r}: its work "
                     f"(the person's answer, its handler) must set {obj_id}, or the task's end stops with \"A data "
                     f"object could not be set\"; give the bpmn:dataObject id=\"{name}\" (and its references "
                     f"dataObjectRef=\"{name}\")", file=file, line=assoc.sourceline, element_id=task.get("id"),
                     field="dataOutputAssociation", severity="warning")

    def _check_code(self, proc: _Node) -> None:
        """Scripts, and conditions on flows that ``_check_gateways`` does not already read."""
        xor_ids = {gw.get("id") for gw in proc.element.iter(_bpmn("exclusiveGateway"))}
        inclusive_ids = {gw.get("id") for gw in proc.element.iter(_bpmn("inclusiveGateway"))}
        for flow in proc.element.iter(_bpmn("sequenceFlow")):
            expr = flow.find(_bpmn("conditionExpression"))
            if expr is not None and (expr.text or "").strip() and flow.get("sourceRef") not in xor_ids:
                tree = self._compile(expr.text, "eval", expr, proc.file, flow.get("id"), "condition_syntax",
                                     "conditionExpression")
                if isinstance(tree, ast.Expression) and flow.get("sourceRef") in inclusive_ids:
                    self._check_probability(tree, expr, flow, flow.get("sourceRef"), proc.file)
        for tag in ("condition", "loopCardinality", "completionCondition", "loopCondition"):
            for el in proc.element.iter(_bpmn(tag)):
                if (el.text or "").strip():
                    self._compile(el.text, "eval", el, proc.file, _flow_node_id(el), "condition_syntax", tag,
                                  what="expression")
        for tag in ("timeDuration", "timeDate", "timeCycle"):
            for el in proc.element.iter(_bpmn(tag)):
                self._check_timer(el, tag, proc.file)
        for definition in proc.element.iter(_bpmn("timerEventDefinition")):
            if any((el.text or "").strip() for tag in ("timeDuration", "timeDate", "timeCycle")
                   for el in definition.iterfind(_bpmn(tag))):
                continue
            # what a modeler saves for a timer whose type is not chosen yet; SpiffWorkflow's own
            # words for it ("Unknown Time Specification") say neither what is missing nor what to write
            event = _flow_node_id(definition)
            if event:
                self.related.add(event)
            self.add("timer_expression", f"timer {event!r} says neither when nor how long: its "
                     "bpmn:timerEventDefinition gives no timeDuration, timeDate or timeCycle (none, or an empty one: "
                     "a timer whose type or value was not filled in in the modeler), so SpiffWorkflow cannot run it; "
                     "give it one, e.g. "
                     "<bpmn:timeDuration>\"PT1H\"</bpmn:timeDuration> (ISO 8601 text, quoted)", file=proc.file,
                     line=definition.sourceline, element_id=event, field="timerEventDefinition")
        for definition in proc.element.iter(_bpmn("conditionalEventDefinition")):
            condition = definition.find(_bpmn("condition"))
            if condition is not None and (condition.text or "").strip():
                continue
            # what a modeler saves for a conditional event not filled in: SpiffWorkflow evaluates
            # the expression None there and stops ("Error evaluating expression 'None'")
            event = _flow_node_id(definition)
            self.add("condition_syntax", f"conditional event {event!r} has no condition (its bpmn:condition is "
                     f"{'empty' if condition is not None else 'missing'}: a conditional event not filled in in the "
                     "modeler), so the run stops when it is reached; write the Python expression over the context "
                     "that it waits to hold, e.g. <bpmn:condition>approved == True</bpmn:condition>", file=proc.file,
                     line=(condition if condition is not None else definition).sourceline, element_id=event,
                     field="condition")
        for definition in proc.element.iter(_bpmn("conditionalEventDefinition")):
            self._check_condition_filter(definition, proc.file)
        for task in proc.element.iter(_bpmn("scriptTask")):
            script = task.find(_bpmn("script"))
            if script is not None and (script.text or "").strip():
                language = (task.get("scriptFormat") or "").strip()
                if language and "python" not in language.lower() and language.lower() != "py":
                    self._check_script_language(task, script, language, proc.file)
                else:
                    self._compile(script.text, "exec", script, proc.file, task.get("id"), "script_syntax", "script")
        for tag in ("preScript", "postScript"):
            for el in proc.element.iter(f"{{{SPIFF_NS}}}{tag}"):
                if (el.text or "").strip():
                    owner = _owner_id(el.getparent())
                    self._compile(el.text, "exec", el, proc.file, owner, "script_syntax", f"spiffworkflow:{tag}")

    def _check_condition_filter(self, definition: Any, file: str) -> None:
        """Camunda 7's (Operaton's) variableName / variableEvents on a conditional event: the other engine
        checks the condition only as that variable changes; layerflow checks it after every step."""
        names = {q.localname: (f"{prefix}:{q.localname}", v.strip()) for k, v in definition.attrib.items()
                 for q in [etree.QName(k)] for prefix in [_ENGINE_NAMESPACES.get(q.namespace or "")] if prefix}
        variable, events = names.get("variableName"), names.get("variableEvents")
        if not (variable and variable[1]) and not (events and events[1]):
            return
        said = [f"{item[0]}={item[1]!r}" for item in (variable, events) if item and item[1]]
        kinds = {"create": "set", "update": "updated", "delete": "deleted"}
        how = " or ".join(kinds.get(e.strip(), e.strip()) for e in events[1].split(",")) if events and events[1] \
            else "changes"
        whom = f"variable {variable[1]!r}" if variable and variable[1] else "a variable"
        what = f"{whom} is {how}" if how != "changes" else f"{whom} changes"
        read = f"make the condition read {variable[1]!r}" if variable and variable[1] else "make the condition read it"
        self.add("foreign_extension", f"conditional event {_flow_node_id(definition)!r}: its "
                 f"bpmn:conditionalEventDefinition has {' and '.join(said)}, the other engine's filter: it checks "
                 f"its condition only when {what}; layerflow does not read it: the condition is checked "
                 "after every step, whatever changed, and the event fires as soon as it holds; if it must wait "
                 f"for that change, {read} (e.g. compare it with a value saved before)", file=file,
                 line=definition.sourceline, element_id=_flow_node_id(definition),
                 field=(variable or events or ("",))[0], severity="warning")

    def _check_condition_names(self, proc: _Node) -> None:
        """A conditional event's condition that reads a name nothing in the files sets waits silently
        for ever (unless the data is given from outside: a warning). Errs on the side of "set": a name
        any script, attribute, form, config, decision or extension text of the files names is taken
        as set, and no name is reported where a handler or a model writes keys not known here.
        A process's own conditional start is not checked: its condition is fed by the start data (or the
        call's), nothing can run before it to set the name, and ``run`` says at once that it waits there."""
        for definition in proc.element.iter(_bpmn("conditionalEventDefinition")):
            owner = definition.getparent()
            if owner.tag == _bpmn("startEvent") and owner.getparent() is proc.element:
                continue
            condition = definition.find(_bpmn("condition"))
            text = (condition.text or "").strip() if condition is not None else ""
            source = python_source(text) if text else None
            try:
                tree = ast.parse(source, mode="eval") if source else None
            except (SyntaxError, ValueError):
                continue  # condition_syntax reports it
            if tree is None or not self._condition_names_set():
                continue
            bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | {
                a.arg for n in ast.walk(tree) if isinstance(n, ast.Lambda) for a in n.args.args}
            read = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                    and n.id not in bound and not hasattr(builtins, n.id) and not n.id.startswith("_")]
            setters = self._condition_names_set()
            event = _flow_node_id(definition)
            for name in dict.fromkeys(read):
                if re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", setters or ""):
                    continue
                self.add("condition_name_never_set", f"conditional event {event!r} waits until {text!r} holds, and "
                         f"nothing in {proc.file} sets {name!r} (no script, form field, data mapping, config, decision "
                         f"or payload variable names it), so it waits for ever unless {name!r} is given from outside: "
                         f"in the start data (--data, REST), a message's payload, or `layerflow resume ID --set "
                         f"{name}=VALUE`. Set {name!r} in a script or form before the event, or check its spelling",
                         file=proc.file, line=condition.sourceline if condition is not None else None,
                         element_id=event, field="condition", severity="warning")

    def _check_gateway_conditions(self, proc: _Node) -> None:
        """A conditional catch event on a branch of an event-based gateway: SpiffWorkflow 3.2 never
        evaluates its condition (the gateway's race is won by messages, signals and timers only), so
        the branch never fires, however the data changes; the other branches still run (a warning)."""
        for event in proc.element.iter(_bpmn("intermediateCatchEvent")):
            definition = event.find(_bpmn("conditionalEventDefinition"))
            gateway = _event_gateway_before(event, event.get("id")) if definition is not None else None
            if gateway is None:
                continue
            condition = definition.find(_bpmn("condition"))
            text = (condition.text or "").strip() if condition is not None else ""
            self.add("conditional_branch_never_fires",
                     f"conditional event {event.get('id')!r} ({text!r}) is a branch of event-based gateway "
                     f"{gateway!r}: SpiffWorkflow 3.2 never evaluates such a branch's condition, so it never "
                     "fires (writing what it reads, `resume --set` or REST inject, does not release it) and only "
                     "the gateway's other branches can decide. Model the race as a receive task (or a user task) "
                     "for the other event with an interrupting conditional boundary event holding this condition, "
                     "or give the branch a message or signal that whoever changes the data sends",
                     file=proc.file, line=event.sourceline, element_id=event.get("id"), severity="warning")
        for event in proc.element.iter(_bpmn("intermediateCatchEvent")):
            cycle = event.find(f"{_bpmn('timerEventDefinition')}/{_bpmn('timeCycle')}")
            gateway = _event_gateway_before(event, event.get("id")) if cycle is not None else None
            if gateway is None:
                continue
            text = (cycle.text or "").strip()
            self.add("cycle_branch_never_fires",
                     f"timer event {event.get('id')!r} (timeCycle {text}) is a branch of event-based gateway "
                     f"{gateway!r}: SpiffWorkflow 3.2 never starts a cycle timer there, so it never fires (`layerflow "
                     "timers` does not list it) and only the gateway's other branches can decide. Give the branch "
                     "a timeDuration (it fires once, that long after the gateway is reached), or model the race as a "
                     "receive task (or a user task) for the other event with a boundary timer holding the cycle "
                     "(non-interrupting: it repeats while the task waits)",
                     file=proc.file, line=event.sourceline, element_id=event.get("id"), severity="warning")

    def _condition_names_set(self) -> str | None:
        """Every text of the files given that may set a name, joined (computed once): scripts, the
        values of attributes (a form field's id, a payload variable, a mapping's target), extension
        elements, the config files, the DMN files and the files the BPMN names beside it (forms);
        not the conditions that read names, nor documentation. None (nothing is reported) when a
        handler or a model with no output keys writes keys not known here."""
        if self._setters is None:
            text = self._setter_text(configs=True)
            self._setters = text if text is not None else ""
        return self._setters or None

    def _open_ended_writers(self) -> bool:
        """A handler, a model with no output keys or a formless task (a person's answer: any key) may
        write keys that no text of the process names."""
        return any(src.config.handler or (src.config.llm is not None and not src.config.llm.output_keys
                                          and not src.config.llm.output_schema) for src in self.sources) \
            or any(_formless_task(el) for doc in self.docs if doc.root is not None
                   for tag in ("userTask", "manualTask") for el in doc.root.iter(_bpmn(tag)))

    def _setter_text(self, *, configs: bool, open_ended: bool = False) -> str | None:
        """``_condition_names_set``'s text, with the config files' text or without it (None: a handler,
        a model with no output keys or a formless task writes keys not known here; with ``open_ended``
        the text all the same, the handler files that the configs name in it)."""
        if self._open_ended_writers() and not open_ended:
            return None
        reads = {"conditionExpression", "condition", "completionCondition", "loopCardinality", "loopCondition",
                 "documentation", "text"}
        parts: list[str] = []
        files: set[Path] = {*(self._config_paths if configs else ()),
                            *(f.path for f in self.dmn_files if getattr(f, "path", None))}
        for doc in self.docs:
            if doc.root is None:
                continue
            for el in doc.root.iter():
                if not isinstance(el.tag, str):
                    continue
                tag = etree.QName(el)
                # a label (a task's, an event's, a flow's name) sets nothing; a data object's name does
                labelled = tag.namespace == BPMN_NS and tag.localname not in _NAMED_DATA
                parts.extend(str(v) for k, v in el.attrib.items() if not (k == "name" and labelled))
                if tag.localname not in reads and el.text:
                    parts.append(el.text)
            beside = doc.path.parent
            named = {v for el in doc.root.iter() if isinstance(el.tag, str)
                     for v in [*el.attrib.values(), (el.text or "").strip()] if v and len(v) < 200}
            files.update(beside / v for v in named if "/" not in v and (beside / v).is_file())
        if open_ended:
            files.update(self._handler_files())
        for path in files:
            try:
                parts.append(Path(path).read_text(errors="replace"))
            except OSError:
                continue
        return "\n".join(parts) or " "

    def _handler_files(self) -> set[Path]:
        """The ``file.py`` handler files the configs name (relative to the process folder)."""
        base = self.paths[0].resolve().parent if self.paths else Path.cwd()
        refs = (src.config.handler.rpartition(":")[0] for src in self.sources if isinstance(src.config.handler, str))
        return {path if path.is_absolute() else base / path for path in map(Path, refs) if path.suffix == ".py"}

    def _unwritten_key(self, config: ProcessConfigFile | None) -> Callable[..., str | None]:
        """For a key a config names (a policy's, a preserveKeys entry): None when something in the process
        may write it, else the "did you mean" hint (maybe empty) of a key nothing writes; with ``near_only``
        (and always when handlers may write any key) None too unless a written key is close to it. What writes keys:
        the BPMN's scripts, forms, mappings and decisions (without the config files, which name the key
        themselves), and of the configs the models' outputKeys and outputSchema properties, contextInject,
        SYSTEM and the data layers' keys; when a handler (or a formless task, a model with no output keys)
        may write keys, the handler files' text too."""
        open_ended = self._open_ended_writers()
        text = self._setter_text(configs=False, open_ended=open_ended) or " "
        known: set[str] = set(config.system) | set(config.data_layers) if config is not None else set()
        for src in self.sources:
            cfg = src.config
            if cfg.llm is not None:
                known.update(cfg.llm.output_keys)
                props = (cfg.llm.output_schema or {}).get("properties")
                known.update(props if isinstance(props, Mapping) else ())
            for branch in cfg.branches:
                known.update(branch.context_inject)
        words = set(re.findall(r"[A-Za-z_][\w.-]*", text)) | known

        def unwritten(key: str, *, near_only: bool = False) -> str | None:
            if key in known or key.startswith("_") or re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", text):
                return None
            if not (open_ended or near_only):
                return _did_you_mean(key, words - {key})
            # a misspelling only: close to a key the process writes (not an element id sharing a word)
            near = difflib.get_close_matches(key, words - {key}, n=3, cutoff=0.8)
            return _did_you_mean(key, near) if near else None

        return unwritten

    def _check_policy_keys(self, config: ProcessConfigFile | None) -> None:
        """A join's ``conflictPolicy`` rule (or ranking) for a key nothing in the process writes never
        applies: most likely a misspelt key. Only a warning: the key may come from outside (the start
        data, a message's payload, an inject)."""
        if not any(src.config.conflict_policy is not None for src in self.sources):
            return
        unwritten = self._unwritten_key(config)
        for src in self.sources:
            policy = src.config.conflict_policy
            if policy is None:
                continue
            found: list[tuple[str, tuple[str | int, ...], str]] = [
                (f"rule {i}", ("conflictPolicy", "rules", i, "key"), rule.key) for i, rule in enumerate(policy.rules)]
            found += [(f"ranking {key!r}", ("conflictPolicy", "rankings", key), key) for key in policy.rankings]
            for what, path, key in found:
                hint = unwritten(key)
                if hint is None:
                    continue
                self.add("policy_key_never_written",
                         f"conflictPolicy {what} of join {src.element_id!r} is for key {key!r}, which nothing in the "
                         "process writes (no script, form field, data mapping, decision, model outputKeys or "
                         f"contextInject names it){hint}: it settles a conflict on "
                         f"{key!r} only, and none can arise unless {key!r} comes from outside (the start data, "
                         "--data, a message's payload); check its spelling", file=src.file,
                         line=src.line_of(*path), element_id=src.element_id, field=".".join(map(str, path)),
                         severity="warning")

    def _check_preserve_keys(self, config: ProcessConfigFile | None) -> None:
        """A ``preserveKeys`` entry for a key nothing in the process writes keeps nothing, while the key it
        was meant for (misspelt) is folded by the compressions like any other: its value is lost from the
        context without a word. Only an entry close to a key the process writes is named (a warning): a key
        nothing here names is start data (``--data``) as often as not."""
        if not any(src.config.effective_preserve_keys for src in self.sources):
            return
        unwritten = self._unwritten_key(config)
        for src in self.sources:
            for key in src.config.effective_preserve_keys:
                hint = unwritten(key, near_only=True)  # a key nothing here names: start data, preserved as it comes
                if hint is None:
                    continue
                self.add("preserve_key_never_written",
                         f"preserveKeys of {src.element_id!r} name {key!r}, which nothing in the process writes (no "
                         "script, form field, data mapping, decision, handler file, model outputKeys or contextInject "
                         f"names it){hint}: it keeps nothing, and the key it was meant for is folded by the "
                         "compressions like any other; check its spelling", file=src.file,
                         line=src.line_of("preserveKeys"), element_id=src.element_id, field="preserveKeys",
                         severity="warning")

    def _called_elsewhere(self, call: Any) -> str:
        """Where another modeler names the process a call activity without calledElement calls, and
        the calledElement to write: Camunda 8's zeebe:calledElement (a process id, or a FEEL expression
        after '=' that picks the process as the instance runs), Signavio's "Subprocess reference"."""
        extensions = call.find(_bpmn("extensionElements"))
        zeebe = (extensions.find("{http://camunda.org/schema/zeebe/1.0}calledElement")
                 if extensions is not None else None)
        named = (zeebe.get("processId") or "").strip() if zeebe is not None else ""
        if named.startswith("="):
            literal = re.fullmatch(r"=\s*\"([^\"]*)\"\s*", named)
            if literal is not None:
                return (f" (its zeebe:calledElement processId={named!r} is Camunda 8's, a FEEL string): name the "
                        f"process it calls, calledElement=\"{literal.group(1)}\"")
            return (f" (its zeebe:calledElement processId={named!r} is a FEEL expression, with which Camunda 8 "
                    "picks the process as the instance runs): SpiffWorkflow calls the one process calledElement "
                    "names; draw an exclusive gateway over what the expression reads and one call activity per "
                    "process it may pick, each with its calledElement=\"PROCESS_ID\"")
        if named:
            return (f" (its zeebe:calledElement processId={named!r} is Camunda 8's): name the process it calls, "
                    f"calledElement=\"{named}\"")
        entry = next((el for el in (extensions if extensions is not None else [])
                      if isinstance(el.tag, str) and el.tag == "{http://www.signavio.com}signavioMetaData"
                      and el.get("metaKey") == "entry" and (el.get("metaValue") or "").strip()), None)
        if entry is not None:
            reference = entry.get("metaValue").strip()
            target = next((p for p in self.processes if reference in (p.id, (p.element.get("name") or "").strip())),
                          None)
            todo = (f"calledElement=\"{target.id}\"" if target is not None
                    else "calledElement=\"PROCESS_ID\", the id of the process it calls (give its file too)")
            return (f" (Signavio names the process in its Subprocess reference, signavio:signavioMetaData "
                    f"metaKey=\"entry\" metaValue={reference!r}, which SpiffWorkflow 3.2 does not read): name the "
                    f"process it calls, {todo}")
        return ": name the process it calls, calledElement=\"PROCESS_ID\""

    def _check_escalation_codes(self, doc: _Doc) -> None:
        """A bpmn:escalation with no escalationCode that a throw event names: every catch that names
        an escalation without a code catches it, as every catch-all does (no escalationRef), in
        SpiffWorkflow and Camunda 7 alike; rarely what was meant, so a warning."""
        throws: dict[str, list[str]] = {}
        for tag in ("intermediateThrowEvent", "endEvent"):
            for event in doc.root.iter(_bpmn(tag)):
                for definition in event.iterfind(_bpmn("escalationEventDefinition")):
                    if definition.get("escalationRef"):
                        throws.setdefault(definition.get("escalationRef"), []).append(event.get("id") or "?")
        for escalation in doc.root.iterfind(_bpmn("escalation")):
            eid = escalation.get("id")
            if not eid or escalation.get("escalationCode") or eid not in throws:
                continue
            thrown_by = ", ".join(repr(t) for t in throws[eid])
            self.add("escalation_without_code", f"bpmn:escalation {eid!r} has no escalationCode and is thrown by "
                     f"{thrown_by}: every catch naming an escalation without a code catches it, as does every "
                     "catch without an escalationRef; give it an escalationCode (a catch without an escalationRef "
                     "catches every escalation, which is meant for catch-alls)", file=doc.file,
                     line=escalation.sourceline, element_id=eid, field="escalationCode", severity="warning")

    def _check_payloads(self, doc: _Doc) -> None:
        """A message's payload (``spiffworkflow:messagePayload``, on the bpmn:message or where it is sent)
        and a signal's, error's or escalation's (``payloadExpression``): Python expressions SpiffWorkflow
        evaluates as the event is thrown, read here as conditions are."""
        for tag in ("messagePayload", "payloadExpression"):
            for el in doc.root.iter(f"{{{SPIFF_NS}}}{tag}"):
                if not (el.text or "").strip():
                    continue
                owner = next((a for a in el.iterancestors() if a.get("id") and a.tag not in (
                    _bpmn("extensionElements"),) and not a.tag.endswith("EventDefinition")), None)
                owner_id = _flow_node_id(el) or (owner.get("id") if owner is not None else None)
                what = "payload" + (f" of bpmn:{etree.QName(owner).localname} {owner_id!r}" if owner is not None else "")
                self._compile(el.text, "eval", el, doc.file, owner_id, "condition_syntax", tag, what=what)

    def _check_nameless_messages(self, docs: list[_Doc]) -> None:
        """SpiffWorkflow routes a message by its bpmn:message's name, and a message with no name has
        the name None: two such messages are one to it, and each event waiting for one catches the
        other's (a message end event meant for another pool restarts its own pool's message start)."""
        users: dict[str, list[str]] = {}
        for doc in docs:
            for el in doc.root.iter():
                if el.get("messageRef") and el.tag in (_bpmn("messageEventDefinition"), _bpmn("sendTask"),
                                                       _bpmn("receiveTask")):
                    owner = el.getparent() if el.tag == _bpmn("messageEventDefinition") else el
                    users.setdefault(el.get("messageRef"), []).append(owner.get("id") or "")
        nameless = [(m, doc) for doc in docs for m in doc.root.iter(_bpmn("message"))
                    if not (m.get("name") or "").strip() and m.get("id") in users]
        if len(nameless) < 2:
            return
        ids = [m.get("id") for m, _ in nameless]
        for message, doc in nameless:
            mid = message.get("id")
            others = ", ".join(repr(o) for o in ids if o != mid)
            self.add("message_without_name", f"bpmn:message {mid!r} (used by "
                     f"{', '.join(map(repr, users[mid]))}) has no name, nor has {others}: SpiffWorkflow routes a "
                     "message by its name, so these are one message to it and each event waiting for one catches "
                     "the others; give each bpmn:message a name of its own (name=\"...\")", file=doc.file,
                     line=message.sourceline, element_id=mid, field="name")

    def _check_correlations(self, doc: _Doc) -> None:
        """A correlation property's retrieval expressions, which SpiffWorkflow evaluates over a message's
        payload when the message is sent or caught: one that is not Python fails every delivery. Over
        a message that no element of the files sends or catches it is never evaluated (SpiffArena
        keeps the correlations of a whole collection in each file), so it is a warning only."""
        exchanged = {el.get("messageRef") for d in self.docs if d.root is not None for el in d.root.iter()
                     if el.tag != _bpmn("correlationPropertyRetrievalExpression") and el.get("messageRef")}
        for prop in doc.root.iter(_bpmn("correlationPropertyRetrievalExpression")):
            message = prop.get("messageRef")
            what = f"correlation retrieval expression (over the payload of message {message!r})"
            for expr in prop.iter(_bpmn("formalExpression")):
                if (expr.text or "").strip():
                    found = len(self.problems)
                    self._compile(expr.text, "eval", expr, doc.file, prop.getparent().get("id"), "condition_syntax",
                                  "formalExpression", what=what)
                    if message not in exchanged:
                        self.problems[found:] = [
                            replace(p, severity="warning", message=f"{p.message} (no element of these files sends "
                                    f"or catches message {message!r}, so nothing evaluates it yet)")
                            for p in self.problems[found:]]

    def _compile(self, text: str, mode: str, el: Any, file: str, element_id: str | None,
                 code: str, field: str, *, what: str | None = None) -> ast.AST | None:
        """Parse as the engine runs it: conditions stripped (``eval``), scripts exactly as written (``exec``)."""
        if mode == "eval":
            first = text[: len(text) - len(text.lstrip())].count("\n")  # lines the strip drops
            source = text.strip()
        else:
            first, source = 0, text
        try:
            # a condition over several lines runs in parentheses (``python_source``), as Python continues lines
            tree = ast.parse((python_source(source) or source) if mode == "eval" else source, mode=mode)
        except SyntaxError as err:
            what = what or ("condition" if mode == "eval" else "script")
            line = el.sourceline + first + (err.lineno or 1) - 1 if el is not None else None
            dialect = expression_dialect(source) if mode == "eval" else None
            activity = _completion_condition_activity(el)
            if dialect is not None and activity is not None and _waits_for_every_instance(source):
                self.add(code, f"{what} {source!r} is a {dialect} expression over the multi-instance counters "
                         "Camunda sets and SpiffWorkflow does not; it holds once every instance has completed, "
                         "which is when a multi-instance activity ends without a completionCondition: remove the "
                         f"bpmn:completionCondition of {activity!r}", file=file, line=line, element_id=element_id,
                         field=field)
                return None
            if dialect is not None:
                self.add(code, f"{what} {source!r} is a {dialect} expression ({_dialect_said(source, dialect)}); "
                         f"layerflow, as SpiffWorkflow, evaluates it as a Python expression over the context: "
                         f"{_python_instead(source, dialect)}", file=file, line=line, element_id=element_id,
                         field=field)
                return None
            language = el.get("language") if el is not None else None
            said = (f" (its language={language!r} is not read: {what}s are Python)"
                    if language and "python" not in language.lower() else "")
            if isinstance(err, IndentationError) and mode == "exec":
                todo = "scripts run exactly as written: start top-level lines at column 0"
            else:
                compared = _comparison_instead(source) if mode == "eval" else None
                java = _java_return_instead(source) if mode == "eval" else None
                spelt = _operators_instead(source) if mode == "eval" and java is None else None
                spaced = _spaced_names_instead(source) if mode == "eval" else None
                keyworded = _keyword_names_instead(source) if mode == "eval" else None
                todo = (f"'=' assigns, '==' compares: write {compared!r}" if compared is not None
                        else java if java is not None
                        else f"Python writes {_operators_said(source)}: write {spelt!r}" if spelt is not None
                        else _spaced_names_said(*spaced) if spaced is not None
                        else _keyword_names_said(*keyworded) if keyworded is not None
                        else f"fix the {what}")
            self.add(code, f"{what} is not valid Python{said}: {err.msg} in {(err.text or source).strip()!r}; "
                     f"{todo}", file=file, line=line, element_id=element_id, field=field)
            return None
        if mode == "eval":
            api, whose = _camunda_api_calls(tree), "Camunda's process API"
            if not api:
                api, whose = _imixs_api_calls(tree), "Imixs-Workflow's API of the document (its workitem)"
            if api:
                what = what or "condition"
                said = _language_not_read(el, what)
                todo = _rewrite_todo(_foreign_reads_instead(source),
                                     lambda t: _camunda_api_calls(t) or _imixs_api_calls(t))
                self.add("condition_camunda_api", f"{what} {source!r} calls {', '.join(api)}, {whose}, which is "
                         f"not here{said}: the run would stop there with a NameError; expressions "
                         f"are Python over the context, where a variable is read by its name: {todo}", file=file,
                         line=el.sourceline if el is not None else None, element_id=element_id, field=field)
                return None
            reads = _javascript_api(tree)
            if reads:
                what = what or "condition"
                said = _language_not_read(el, what)
                todo = _rewrite_todo(_javascript_expression_instead(source), _javascript_api)
                runtime = [r for r in reads if not r.endswith(".length")]
                lengths = [r for r in reads if r.endswith(".length")]
                uses = ([f"uses {', '.join(runtime)}, a JavaScript engine's way (bpmn-engine's, bpmn-server's) to "
                         "reach the process variables, which is not here"] if runtime else []) + \
                       ([f"reads {', '.join(lengths)}, JavaScript's length, which no context value has"]
                        if lengths else [])
                self.add("condition_javascript_api", f"{what} {source!r} {' and '.join(uses)}{said}: the run would "
                         f"stop there ({'NameError' if runtime else 'AttributeError'}); expressions are Python over "
                         "the context, where a variable is read by its name and len(x) is its length: "
                         f"{todo}", file=file,
                         line=el.sourceline if el is not None else None, element_id=element_id, field=field)
                return None
            modules = _module_calls(tree, set())
            if modules:
                # SpiffWorkflow 3.2 gives expressions no modules (SpiffArena's and the tutorial's own
                # script engines did), and an expression cannot import one
                what = what or "condition"
                self.add("condition_unknown_function", f"{what} {source!r} calls {', '.join(modules)}, of Python's "
                         f"{_module_names(modules)} module, which expressions are not given (SpiffWorkflow 3.2 "
                         "gives them no modules, and an expression cannot import one): the run stops there with a "
                         f"NameError; compute the value in a script task before it ({_imports(modules)} there) and "
                         "read the variable here", file=file, line=el.sourceline if el is not None else None,
                         element_id=element_id, field=field, severity="warning")
                return tree
            paths = _attribute_reads(tree)
            if paths:
                what = what or "condition"
                self.add("condition_attribute_read", f"{what} {source!r} reads {', '.join(paths)} as attributes, as "
                         "FEEL and JUEL read an object's fields, but context values are JSON, read by key: the run "
                         "would stop there with an AttributeError ('dict' object has no attribute ...); write "
                         f"{_keys_instead(tree)!r}", file=file, line=el.sourceline if el is not None else None,
                         element_id=element_id, field=field)
                return None
            literals = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in FOREIGN_LITERALS})
            if literals:
                what = what or "condition"
                self.add("condition_literal_name", f"{what} {source!r} reads {', '.join(map(repr, literals))} as a "
                         "context key (unless the context holds one, the run stops there with a NameError): "
                         "expressions are Python, write True, False or None", file=file,
                         line=el.sourceline if el is not None else None, element_id=element_id, field=field,
                         severity="warning")
            camunda = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in _CAMUNDA_LOOP_NAMES})
            if camunda:
                what = what or "condition"
                loop = next((a for a in el.iterancestors() if a.tag == _bpmn("multiInstanceLoopCharacteristics")),
                            None) if el is not None else None
                output = (loop.findtext(_bpmn("loopDataOutputRef")) or "").strip() if loop is not None else ""
                instead = (f"count what is done with the output collection, len({output})" if output else
                           "count what is done with an output collection (loopDataOutputRef), len(...)")
                self.add("condition_camunda_variable", f"{what} {source!r} reads {', '.join(map(repr, camunda))}, "
                         "the multi-instance counters Camunda sets and SpiffWorkflow does not (the run stops there "
                         f"with a NameError): {instead}", file=file, line=el.sourceline if el is not None else None,
                         element_id=element_id, field=field, severity="warning")
            calls = sorted({n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                            and not hasattr(builtins, n.func.id)})
            if calls:
                # context values are JSON, never callable, and an expression sees Python's builtins only
                what = what or "condition"
                hints = [f"{name}(...): {_FOREIGN_FUNCTIONS[name]}" for name in calls if name in _FOREIGN_FUNCTIONS]
                getters = _named_getters(tree)
                if getters:
                    # getDataObject('approved'), getVariable("amount"): another engine's read of one
                    # variable or data object, which an expression here reads by its name
                    hints += [f"{call} reads {name!r}, which an expression reads by its name: write "
                              f"{_getters_instead(tree)!r}" for call, name in getters]
                self.add("condition_unknown_function", f"{what} {source!r} calls {', '.join(map(repr, calls))}, "
                         "which is no Python builtin (another expression language's function?): the run stops there "
                         "with a NameError; expressions are Python over the context"
                         + (f" ({'; '.join(hints)})" if hints else ""), file=file,
                         line=el.sourceline if el is not None else None, element_id=element_id, field=field,
                         severity="warning")
        elif not self._camunda_script(tree, source, el, file, element_id, code, field, what or "script"):
            self._unknown_script_calls(tree, source, el, file, element_id, field, what or "script")
        return tree

    def _unknown_script_calls(self, tree: ast.AST, source: str, el: Any, file: str, element_id: str | None,
                              field: str, what: str) -> None:
        """A script that calls a name it neither defines nor imports and Python has no builtin of:
        context values are JSON, never callable, so the run stops there with a NameError (SpiffArena's
        backend scripts, get_current_user() and the like, exist only inside SpiffArena)."""
        from .handlers import SCRIPT_GLOBALS

        bound = set(SCRIPT_GLOBALS)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                bound.add(node.name)
        modules = _module_calls(tree, bound)
        if modules:
            self.add("script_unknown_function", f"{what} calls {', '.join(modules)}, of Python's "
                     f"{_module_names(modules)} module, which it does not import (SpiffWorkflow 3.2 gives scripts no "
                     f"modules): the run stops there with a NameError; add {_imports(modules)} to the script",
                     file=file, line=el.sourceline if el is not None else None, element_id=element_id, field=field,
                     severity="warning")
        calls = sorted({n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                        and n.func.id not in bound and not hasattr(builtins, n.func.id)})
        if not calls:
            return
        spiffarena = [name for name in calls if name in _SPIFFARENA_SCRIPTS]
        note = (f" ({', '.join(spiffarena)}: SpiffArena's backend script{'s' if len(spiffarena) > 1 else ''}, "
                f"which {'exist' if len(spiffarena) > 1 else 'exists'} only inside SpiffArena)" if spiffarena else "")
        self.add("script_unknown_function", f"{what} calls {', '.join(f'{name}()' for name in calls)}, which it "
                 f"does not define and Python has no builtin of{note}: the run stops there with a NameError; "
                 "compute the value in a handler (handler: file.py:function in the task's config), define the "
                 "function in the script, or give the value in the start data", file=file,
                 line=el.sourceline if el is not None else None, element_id=element_id, field=field,
                 severity="warning")

    def _camunda_script(self, tree: ast.AST, source: str, el: Any, file: str, element_id: str | None, code: str,
                        field: str, what: str) -> bool:
        """A JavaScript or Groovy script of Camunda that happens to parse as Python (its
        ``execution.setVariable("x", ...)`` calls do): an error with the Python to write."""
        calls = _camunda_api_calls(tree)
        if not calls:
            return self._java_script(tree, source, el, file, element_id, code, field, what)
        instead = _camunda_script_instead(source)
        todo = (f"write it as {instead!r}" if instead is not None else
                "set a variable by assigning it (fee = amount * 0.02), read one by its name")
        self.add(code, f"{what} calls {', '.join(calls)}, Camunda's process API, which is not here: the run would "
                 "stop there with a NameError; scripts are Python over the context, where a variable is read by "
                 f"its name and set by assigning it: {todo}", file=file,
                 line=el.sourceline if el is not None else None, element_id=element_id, field=field)
        return True

    def _java_script(self, tree: ast.AST, source: str, el: Any, file: str, element_id: str | None, code: str,
                     field: str, what: str) -> bool:
        """A Java script of jBPM that happens to parse as Python (``System.out.println("...")``,
        ``kcontext.setVariable("x", v)`` lines do): an error with the Python to write."""
        calls = _java_api_calls(tree)
        if not calls:
            return self._javascript_script(tree, source, el, file, element_id, code, field, what)
        instead = _java_script_instead(source)
        todo = (f"write it as {instead!r}" if instead is not None else
                "print with print(...), set a variable by assigning it (packed = True), read one by its name")
        signals = _java_signals(tree)
        if signals:
            todo += (f"; a script cannot raise signal {', '.join(map(repr, signals))} here (signalEvent): draw an "
                     "intermediate throw event after the task with a bpmn:signalEventDefinition whose signalRef "
                     f"names the bpmn:signal of {'that name' if len(signals) == 1 else 'each name'}")
        self.add(code, f"{what} calls {', '.join(calls)}, Java's and jBPM's API (System.out, kcontext), which is not "
                 "here: the run would stop there with a NameError; scripts are Python over the context, where a "
                 f"variable is read by its name and set by assigning it: {todo}", file=file,
                 line=el.sourceline if el is not None else None, element_id=element_id, field=field)
        return True

    def _javascript_script(self, tree: ast.AST, source: str, el: Any, file: str, element_id: str | None,
                           code: str, field: str, what: str) -> bool:
        """A JavaScript engine's script (bpmn-engine's, bpmn-server's) that happens to parse as Python
        (``this.environment.variables.x += 1; next();`` does): an error with the Python to write."""
        uses = _javascript_api(tree)
        if not uses:
            return False
        instead = _javascript_script_instead(source)
        todo = (f"write it as {instead!r}" if instead is not None else
                "print with print(...), set a variable by assigning it (count += 1), read one by its name")
        self.add(code, f"{what} uses {', '.join(uses)}, a JavaScript engine's runtime (bpmn-engine's, "
                 "bpmn-server's: next() hands control back, environment.variables and this.environment hold the "
                 "variables, console prints), which is not here: the run would stop there (NameError, or "
                 "TypeError for next()); scripts are Python over the context, where a variable is read by its "
                 f"name and set by assigning it: {todo}", file=file,
                 line=el.sourceline if el is not None else None, element_id=element_id, field=field)
        return True

    def _check_timer(self, el: Any, tag: str, file: str) -> None:
        """SpiffWorkflow evaluates a timer's text as a Python expression: modelers write ISO 8601 bare."""
        text = (el.text or "").strip()
        if not text:
            return
        event = _flow_node_id(el)
        first = (el.text or "")[: len(el.text or "") - len((el.text or "").lstrip())].count("\n")
        if _JUEL_IN_TEXT.search(text) and not _JUEL_IN_TEXT.fullmatch(text):
            self.add("timer_expression", f"timer {event!r}: {tag} {text!r} {_juel_in_timer_said(tag, text)}",
                     file=file, line=el.sourceline + first, element_id=event, field=tag)
            return
        if _ISO_8601.fullmatch(text):
            self.add("timer_expression", f"timer {event!r}: {tag} {text} is read as a Python expression (as "
                     f"SpiffWorkflow reads it), where it is no value; write it as a string: \"{text}\"",
                     file=file, line=el.sourceline + first, element_id=event, field=tag)
            return
        try:
            ast.parse(text, mode="eval")
        except SyntaxError as err:
            dialect = expression_dialect(text)
            iso = _jbpm_duration_iso(text) if tag == "timeDuration" else None
            cron_language = f" (language={el.get('language')!r})" if el.get("language") else ""
            clock = _feel_clock_timer(tag, text) if dialect == "FEEL" else None
            todo = (clock if clock is not None else
                    _python_instead(_feel_timer_source(text) if dialect == "FEEL" else text, dialect)
                    if dialect is not None else
                    f"{text!r} is jBPM's short form of the ISO 8601 duration {iso}: write {iso} (quoted)"
                    if iso is not None else
                    f"{text!r} is a cron expression{cron_language}, as "
                    "jBPM, Camunda and Zeebe read one; SpiffWorkflow has no cron: " + _cron_instead(text)
                    if _CRON.fullmatch(text) else
                    "write a Python expression that gives ISO 8601 text, e.g. \"PT1H\" (quoted) or a variable")
            self.add("timer_expression", f"timer {event!r}: {tag} {text!r} is not a Python expression ({err.msg}); "
                     f"SpiffWorkflow evaluates it over the context: {todo}", file=file,
                     line=el.sourceline + first, element_id=event, field=tag)
            return
        foreign = _foreign_method_calls(ast.parse(text, mode="eval"))
        if foreign:
            self.add("timer_expression", f"timer {event!r}: {tag} {text!r} calls {', '.join(foreign)}, another "
                     "language's date API (C#, Java) over its engine's objects, not Python: no context value has "
                     "such a method (values are JSON), so the run stops where the timer starts; write a Python "
                     "expression that gives ISO 8601 text: a duration such as \"P1D\" (quoted), or a variable an "
                     "earlier step sets", file=file, line=el.sourceline + first, element_id=event, field=tag)
            return
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return  # an expression over the context: its value is known at run time only
        if isinstance(value, str) and _timer_text_problem(tag, value) is not None:
            from .spiff import duration_hint

            hint = duration_hint(value) if tag == "timeDuration" else ""
            todo = hint or f", so the timer fails when it is reached; write one such as {_TIMER_TEXT[tag][1]}"
            self.add("timer_expression", f"timer {event!r}: {tag} {text} is no ISO 8601 {_TIMER_TEXT[tag][0]}{todo}",
                     file=file, line=el.sourceline + first, element_id=event, field=tag)

    def _check_script_language(self, task: Any, script: Any, language: str, file: str) -> None:
        """SpiffWorkflow ignores ``scriptFormat`` and runs every script as Python: so does the engine."""
        tid = task.get("id")
        try:
            tree = ast.parse(script.text, mode="exec")
        except SyntaxError as raised:
            err = _past_indentation(script.text, raised)
            if err is raised and isinstance(raised, IndentationError):
                self._indented_script(task, script, language, raised, file)
                return
            thrown = _BPMN_ERROR_THROW.fullmatch(script.text.strip())
            if thrown is not None:
                args = ", ".join(json.dumps(a) for a in (thrown["code"], thrown["message"]) if a is not None)
                self._not_python(tid, language, f"this one throws BPMN error {thrown['code']!r} ({thrown['cls']}); "
                                 f"write it as 'raise BpmnError({args})' (BpmnError is in every script's namespace) "
                                 'and set scriptFormat="python"', file, script.sourceline)
                return
            declared = _javascript_undeclared(script.text)
            if declared is not None and self._camunda_script(
                    declared[0], declared[1], script, file, tid, "script_language", "script",
                    f"script task {tid!r} (scriptFormat={language!r}, a JavaScript script (var declarations, ; at "
                    "line ends), which layerflow runs as Python, as SpiffWorkflow does)"):
                return
            printed = _groovy_print_instead(script.text)
            if printed is not None:
                self._not_python(tid, language, f"this one prints with Groovy's println (command syntax, no "
                                 f"parentheses), which is not Python: write it as {printed!r} and set "
                                 'scriptFormat="python"', file, script.sourceline)
                return
            self._not_python(tid, language, f"this one is not Python ({err.msg} in {(err.text or '').strip()!r}); "
                             'rewrite it in Python and set scriptFormat="python", or give the task a handler '
                             "(handler: file.py:function in its config)", file, script.sourceline + (err.lineno or 1) - 1)
            return
        if self._camunda_script(tree, script.text, script, file, tid, "script_language", "script",
                                f"script task {tid!r} (scriptFormat={language!r}, run as Python, as SpiffWorkflow does)"):
            return
        self.add("script_language", f"script task {tid!r} has scriptFormat={language!r}, but layerflow runs scripts "
                 "as Python, as SpiffWorkflow does, and this one parses as Python: it runs as Python; check it "
                 "means what it should in Python and set scriptFormat=\"python\"", file=file, line=task.sourceline,
                 element_id=tid, field="scriptFormat", severity="warning")

    def _indented_script(self, task: Any, script: Any, language: str, raised: SyntaxError, file: str) -> None:
        """A script of another language indented as the XML is (Flowable's test models), which parses
        once dedented: its indentation hid what it calls (``System.out.println``) behind "unexpected
        indent"; say what it calls and the Python to write, or that it is Python at column 0."""
        tid, dedented = task.get("id"), textwrap.dedent(script.text)
        found = len(self.problems)
        if self._camunda_script(ast.parse(dedented, mode="exec"), dedented, script, file, tid, "script_language",
                                "script", f"script task {tid!r} (scriptFormat={language!r}, run as Python, as "
                                "SpiffWorkflow does)"):
            self.problems[found:] = [replace(p, message=f"{p.message}, and start its lines at column 0 (scripts run "
                                             "exactly as written)") for p in self.problems[found:]]
            return
        self._not_python(tid, language, f"its lines are indented ({raised.msg} in {(raised.text or '').strip()!r}); "
                         "it is Python once its lines start at column 0 (scripts run exactly as written): unindent "
                         'it and set scriptFormat="python"', file, script.sourceline + (raised.lineno or 1) - 1)

    def _not_python(self, tid: str, language: str, said: str, file: str, line: int) -> None:
        self.add("script_language", f"script task {tid!r} has scriptFormat={language!r}, and layerflow runs scripts "
                 f"as Python only, as SpiffWorkflow does: {said}", file=file, line=line, element_id=tid,
                 field="scriptFormat")

    # -- the shape of the flow ---------------------------------------------------------------

    def _check_shapes(self, proc: _Node) -> None:
        """What modelers draw and SpiffWorkflow reads otherwise (or not at all); each says what to draw instead."""
        file = proc.file
        for el in proc.element.iter():
            if not isinstance(el.tag, str) or el.tag not in _FLOW_NODES:
                continue
            eid, tag = el.get("id") or "(no id)", etree.QName(el).localname
            if links.link_definition(el) is not None:
                self._check_link(el, eid, tag, file)
            if tag == "complexGateway":
                self.related.add(eid)
                self.add("unsupported_element", f"complex gateway {eid!r}: SpiffWorkflow has no complex gateway; draw "
                         "an inclusive gateway (its flows' conditions choose the paths, its join waits for the paths "
                         "taken) or a parallel one", file=file, line=el.sourceline, element_id=eid)
            if tag == "boundaryEvent" and el.find(_bpmn("cancelEventDefinition")) is not None:
                self._check_cancel(el, eid, file)
            if tag == "boundaryEvent":
                self._check_thrown_at_person(el, eid, file)
            if el.find(_bpmn("compensateEventDefinition")) is not None and tag != "startEvent":
                self._check_compensation(el, eid, tag, file)
            if tag == "adHocSubProcess":
                done = _condition_text(el, "completionCondition") or "its completion condition"
                self.add("unsupported_element", f"ad-hoc sub-process {eid!r}: SpiffWorkflow 3.2 cannot run one to its "
                         "end (its bookkeeping of the paths fails after the first task, and one holding a data "
                         "object cannot be saved) and evaluates the completionCondition over its own data, not "
                         "the context; draw the choice as a loop instead: a user task that picks the next step, "
                         "an exclusive gateway to the task picked, a flow from each task back to the user task, "
                         f"and a flow out of the gateway when {done} holds",
                         file=file, line=el.sourceline, element_id=eid)
            if eid in ("Start", "End") or eid.endswith((".EndJoin", ".BoundaryEventSplit", ".BoundaryEventJoin")):
                self.add("reserved_id", f"id {eid!r} is the name SpiffWorkflow gives a task of its own in every "
                         f"process, so this bpmn:{tag} takes its place (the process fails to start or skips "
                         f"steps): rename it, e.g. {tag[0].upper() + tag[1:]}_1, and its flows' sourceRef/targetRef",
                         file=file, line=el.sourceline, element_id=eid, field="id")
            outgoing, incoming = _outgoing(el), _incoming(el)
            splits = tag.endswith("Gateway") or tag == "startEvent"
            if len(outgoing) > 1 and not splits and eid not in self.related:  # not: a flow to nowhere
                self.related.add(eid)
                choice = el.get("default") or any(_condition_text(f) for f in outgoing)
                # BPMN takes each conditional flow out of an activity whose condition holds and each
                # flow without one (the default only when none holds): an inclusive gateway's choice
                bare = [f.get("id") for f in outgoing if not _condition_text(f) and f.get("id") != el.get("default")]
                given = (f", giving {', '.join(map(repr, bare))}, which {'has' if len(bare) == 1 else 'have'} none, "
                         "the condition True" if bare else "")
                default = f" and {el.get('default')!r} as its default flow" if el.get("default") else ""
                gateways = ("an inclusive gateway after it with the flows' conditions, as BPMN takes every flow "
                            f"out of an activity whose condition holds{given}{default} (an exclusive gateway if "
                            "only one path is meant to run), or a parallel gateway to run them all" if choice else
                            "a parallel gateway after it to run the paths side by side, or an exclusive gateway "
                            "with conditions to choose one")
                flows = ", ".join(f"{f.get('id')!r} to {f.get('targetRef')!r}" for f in outgoing)
                shape = "BPMN's implicit split" + (", and conditional or default flows out of an activity"
                                                   if choice else "")
                self.add("implicit_split", f"bpmn:{tag} {eid!r} has {len(outgoing)} outgoing flows ({flows}); "
                         f"SpiffWorkflow takes one flow out of a task or event, so it cannot load this ({shape}): "
                         f"draw {gateways}", file=file, line=el.sourceline, element_id=eid)
            elif tag not in _CONDITIONAL_SOURCES:
                every = len(outgoing) > 1  # a parallel gateway or a start event: takes them all
                for flow in (f for f in outgoing if _condition_text(f)):
                    self.add("condition_ignored", f"flow {flow.get('id')!r} leaves bpmn:{tag} {eid!r}, "
                             + ("which takes every outgoing flow: its condition is never evaluated" if every else
                                "and only flows out of an exclusive or inclusive gateway have their condition "
                                "evaluated: this one is always taken")
                             + f" (as in SpiffWorkflow); to choose, draw an exclusive gateway after {eid!r}",
                             file=file, line=flow.sourceline, element_id=flow.get("id"), field="conditionExpression",
                             severity="warning")
            # (a scope with no start event: SpiffWorkflow refuses it, and says so)
            on_a_path = not _off_the_flow(el) and el.getparent().find(_bpmn("startEvent")) is not None
            if not outgoing and tag in _PATH_NODES and on_a_path:
                self.add("no_outgoing_flow", f"bpmn:{tag} {eid!r} has no outgoing flow, so its path ends there with no "
                         "end event: in a branch of a split, what it wrote is dropped when the process ends (as in "
                         f"SpiffWorkflow, only paths that reach an end event merge); add a flow from {eid!r} to an "
                         "end event", file=file, line=el.sourceline, element_id=eid, severity="warning")
            if not incoming and tag not in ("startEvent", "boundaryEvent") and on_a_path:
                self.add("unreachable", f"bpmn:{tag} {eid!r} has no incoming flow and no event starts it: it never "
                         "runs; connect it or remove it", file=file, line=el.sourceline, element_id=eid,
                         severity="warning")
            self._check_implementation(el, eid, tag, file)
            self._check_foreign(el, eid, tag, file)
            self._check_timer_settings(el, eid, tag, file)
            self._check_terminate_scope(el, eid, file)
            self._check_jbpm(el, eid, tag, file)
            self._check_data_items(el, eid, tag, file)
            self._check_event_refs(el, eid, tag, file)
            self._check_event_definitions(el, eid, tag, file)
        for scope in (proc.element, *(el for el in proc.element.iter(*_SCOPES) if not _off_the_flow(el))):
            self._check_starts(scope, file)
        self._check_boundary_catches(proc.element, file)
        for sub in proc.element.iter(_bpmn("subProcess")):
            if sub.get("triggeredByEvent") == "true":
                self._check_event_subprocess(sub, file)

    def _check_boundary_catches(self, process: Any, file: str) -> None:
        """Two error (or escalation) boundary events of one activity that catch the same code, or
        both any code: the engine, as SpiffWorkflow 3.2, fires every boundary event of the thrown
        error's or escalation's code (a catch-all only when none of the code is there), so the path
        after each runs (the step after them twice); Camunda refuses such a file."""
        root = process.getroottree().getroot()
        for kind in ("error", "escalation"):
            codes = {el.get("id"): el.get(f"{kind}Code") for el in root.iter(_bpmn(kind))}
            catching: dict[tuple[str, str | None], list[Any]] = {}
            for event in process.iter(_bpmn("boundaryEvent")):
                definition = event.find(_bpmn(f"{kind}EventDefinition"))
                if definition is None or event.get("attachedToRef") is None:
                    continue
                ref = definition.get(f"{kind}Ref")
                code = codes.get(ref) if ref else None
                catching.setdefault((event.get("attachedToRef"), code or None), []).append(event)
            for (activity, code), events in catching.items():
                if len(events) < 2:
                    continue
                ids = [e.get("id") for e in events]
                named = ", ".join(map(repr, ids[:-1])) + f" and {ids[-1]!r}"
                every = "both" if len(ids) == 2 else "all"
                what = f"{kind} code {code!r}" if code else f"any {kind} (no {kind}Code)"
                self.add("boundary_catch_twice", f"boundary events {named} of {activity!r} {every} catch {what}: "
                         f"layerflow, as SpiffWorkflow, fires every one of the code, so {every} fire on one {kind}, "
                         "and the path after each runs (a step they share runs twice); keep one boundary event per "
                         "code and draw the paths from it, or give each its own code", file=file,
                         line=events[-1].sourceline, element_id=ids[-1])

    def _check_link(self, el: Any, eid: str, tag: str, file: str) -> None:
        """A link throw event jumps to the one link catch event of its name in its process level
        (``engine.links``). BPMN (2.0.2, 10.5.6) forbids a link event to be both the target and the
        source of sequence flows: a throw with an outgoing flow would fork there (the flow and the
        jump both run), and a catch with an incoming flow would be a merge nobody drew; both errors."""
        scope = el.getparent()
        level = (f"process {scope.get('id')!r}" if scope.tag == _bpmn("process")
                 else f"{etree.QName(scope).localname} {scope.get('id')!r}")
        name = links.link_name(el)
        if tag not in ("intermediateThrowEvent", "intermediateCatchEvent"):
            self.add("link_misplaced", f"bpmn:{tag} {eid!r} has a linkEventDefinition, which BPMN allows on "
                     "intermediate throw and catch events only (SpiffWorkflow reads it as a plain event); draw a "
                     "link throw event and a link catch event of one name instead", file=file, line=el.sourceline,
                     element_id=eid)
            return
        self.related.add(eid)  # SpiffWorkflow's parser says less about the same pairing
        if tag == "intermediateThrowEvent":
            for flow in _outgoing(el):
                self.add("link_flow", f"link throw event {eid!r} has an outgoing sequence flow {flow.get('id')!r}: "
                         "BPMN forbids a link event to be both the target and the source of sequence flows, and the "
                         "run would fork there (the flow and the jump to the link's catch event both run); delete "
                         f"the flow, or draw it from the element before {eid!r}", file=file, line=flow.sourceline,
                         element_id=eid, field="outgoing")
            if links.catch_of(el):
                return
            if not name and not el.find(_bpmn("linkEventDefinition")).findall(_bpmn("target")):
                self.add("link_name_missing", f"link throw event {eid!r} has a linkEventDefinition with no name, so "
                         f"it jumps nowhere and its path ends there; give its linkEventDefinition the name of the "
                         f"link catch event in {level} it jumps to (name=\"...\")", file=file, line=el.sourceline,
                         element_id=eid, field="name")
                return
            here = sorted({links.link_name(c) for c in links.link_catches(scope)} - {""})
            elsewhere = sorted(c.get("id") for c in el.getroottree().iter(_bpmn("intermediateCatchEvent"))
                               if links.link_definition(c) is not None and links.link_name(c) == name and name)
            hint = (f"; {', '.join(map(repr, elsewhere))} has it in another process level, and a link never leaves "
                    "its own (draw the pair in one level, or a sequence flow)" if elsewhere else
                    _did_you_mean(name, here) or (f"; the links caught in {level}: {', '.join(map(repr, here))}"
                                                  if here else ""))
            self.add("link_unmatched", f"link throw event {eid!r} jumps to link {name!r}, and no link catch event "
                     f"of {level} has that name: the path would end there; add an intermediate catch event with "
                     f"<bpmn:linkEventDefinition name=\"{name}\"/> in {level}{hint}", file=file, line=el.sourceline,
                     element_id=eid, field="name")
            return
        for flow in _incoming(el):
            self.add("link_flow", f"link catch event {eid!r} has an incoming sequence flow {flow.get('id')!r}: BPMN "
                     "forbids a link event to be both the target and the source of sequence flows, and its path "
                     "starts at the link throw events that jump to it; delete the flow, or point it at the element "
                     f"after {eid!r}", file=file, line=flow.sourceline, element_id=eid, field="incoming")
        throws = [t for t in scope.iterchildren(_bpmn("intermediateThrowEvent"))
                  if links.link_definition(t) is not None and el in links.catch_of(t)]
        same = [c for c in links.link_catches(scope) if name and links.link_name(c) == name]
        if len(same) > 1 and same[0] is not el:
            self.add("link_duplicate", f"link catch event {eid!r} catches link {name!r}, as {same[0].get('id')!r} "
                     f"does in {level}: a link throw event would not know where to go on; a link has one catch "
                     "event (and as many throw events as you like): rename one of the links", file=file,
                     line=el.sourceline, element_id=eid, field="name")
        elif not name and not throws:
            self.add("link_name_missing", f"link catch event {eid!r} has a linkEventDefinition with no name, so no "
                     "link throw event can jump to it and it never runs; give its linkEventDefinition the name the "
                     "throw events use (name=\"...\")", file=file, line=el.sourceline, element_id=eid, field="name")
        elif not throws:
            self.add("unreachable", f"link catch event {eid!r} (link {name!r}): no link throw event of {level} jumps "
                     f"to it, so it never runs; add a link throw event named {name!r} where the path should go on "
                     "here, or remove it", file=file, line=el.sourceline, element_id=eid, severity="warning")

    def _check_uncaught_errors(self, main: str | None) -> None:
        """An error end event at the top level of the process that runs, whose error no error event
        sub-process of that process catches (one with the same errorCode, or one that names none):
        nothing else can catch it, and the instance ends there as completed, as in SpiffWorkflow
        (and Camunda 7), which a reader of the diagram rarely expects."""
        proc = next((p for p in self.processes if p.id == main), None)
        if proc is None:
            return
        errors = {e.get("id"): e for doc in self.docs if doc.root is not None for e in doc.root.iter(_bpmn("error"))}
        caught: set[str | None] = set()  # the codes its error event sub-processes catch (None: any error)
        for sub in proc.element.iterchildren(_bpmn("subProcess")):
            for start in sub.iterchildren(_bpmn("startEvent")) if sub.get("triggeredByEvent") == "true" else []:
                for definition in start.iterchildren(_bpmn("errorEventDefinition")):
                    ref = errors.get(definition.get("errorRef") or "")
                    caught.add(ref.get("errorCode") if ref is not None else None)
        for end in proc.element.iterchildren(_bpmn("endEvent")):
            definition = end.find(_bpmn("errorEventDefinition"))
            if definition is None:
                continue
            error = errors.get(definition.get("errorRef") or "")
            if None in caught or (error is not None and error.get("errorCode") in caught):
                continue  # an event sub-process of the process catches it
            named = f" {error.get('name') or error.get('errorCode') or error.get('id')!r}" if error is not None else ""
            self.add("error_end_uncaught", f"error end event {end.get('id')!r} throws the error{named} at the top "
                     f"level of process {proc.id!r}, where nothing can catch it: the instance ends there with "
                     "status completed (no error), as in SpiffWorkflow; to end it as failed, put the steps in a "
                     "sub-process with an error boundary event that leads to a task that says so, or use a plain "
                     "end event and record the outcome in the context", file=proc.file, line=end.sourceline,
                     element_id=end.get("id"), severity="warning")

    def _called_from(self, main: str | None) -> dict[str, str]:
        """The processes of the files that ``main`` calls, directly or not: called process id -> the
        call activity that first reaches it."""
        by_id = {p.id: p for p in self.processes}
        calls: dict[str, str] = {}
        todo = [main] if main in by_id else []
        while todo:
            for call in by_id[todo.pop()].element.iter(_bpmn("callActivity")):
                called = call.get("calledElement")
                if called in by_id and called != main and called not in calls:
                    calls[called] = call.get("id")
                    todo.append(called)
        return calls

    def _check_signals_between_processes(self, main: str) -> None:
        """The process to run, alone, and another process of the files that speak by a signal (MIWG
        C.4.0: the bank's "New employee hired" starts the IT pool's process). An instance runs one
        process (and those it calls), and layerflow carries no signal from one instance to another:
        a signal only another process catches leaves the instance unheard, and a signal start or catch
        event only another process feeds waits until the signal is sent to it (``layerflow send --signal``)."""
        signals = {s.get("id"): s.get("name") or s.get("id") for doc in self.docs if doc.root is not None
                   for s in doc.root.iter(_bpmn("signal"))}
        pools = {pid: el.get("name") for n in self.other_ids.values() if n.tag == "collaboration"
                 for el in n.element.iter(_bpmn("participant")) if (pid := el.get("processRef")) and el.get("name")}
        running = {main, *self._called_from(main)}
        by_id = {p.id: p for p in self.processes}
        throws: dict[str, list[tuple[str, str]]] = {}  # signal name -> (process id, throw event id)
        catches: dict[str, list[tuple[str, str]]] = {}
        for proc in self.processes:
            for definition in proc.element.iter(_bpmn("signalEventDefinition")):
                event, name = definition.getparent(), signals.get(definition.get("signalRef") or "")
                if name is not None:
                    side = throws if event.tag in (_bpmn("intermediateThrowEvent"), _bpmn("endEvent")) else catches
                    side.setdefault(name, []).append((proc.id, event.get("id")))

        def only(name: str, side: dict[str, list[tuple[str, str]]], verbs: tuple[str, str]) -> str | None:
            """"only process 'P' (pool 'X') throws ('e1')": who else throws or catches ``name``, when no
            process of the instance does; None when one does, or none at all."""
            found = side.get(name, [])
            if not found or any(pid in running for pid, _ in found):
                return None
            pids = list(dict.fromkeys(pid for pid, _ in found))
            who = ", ".join(f"process {pid!r}" + (f" (pool {pools[pid]!r})" if pid in pools else "") for pid in pids)
            return f"only {who} {verbs[len(pids) > 1]} ({', '.join(repr(e) for _, e in found)})"

        for name in sorted(set(throws) | set(catches)):
            quoted = shlex.quote(name)
            caught_elsewhere = only(name, catches, ("catches", "catch"))
            for pid, eid in (t for t in throws.get(name, []) if t[0] in running and caught_elsewhere):
                other, node = next(p for p, _ in catches[name]), self.nodes.get(eid)
                todo = (f"to have {other!r} react, run it as an instance of its own (`layerflow run --process "
                        f"{other}`) and send it the signal there (`layerflow send INSTANCE_ID {quoted} --signal`)"
                        if _executable(by_id[other].element) else
                        f"{other!r} is not executable, so nothing here runs it; keep the throw as documentation, "
                        "or remove it")
                self.add("signal_to_other_process", f"signal throw event {eid!r} of process {pid!r} throws signal "
                         f"{name!r}, which {caught_elsewhere}, and layerflow runs {main!r} alone: an instance runs "
                         "one process (and those it calls) and routes no signal to another: this one leaves the "
                         f"instance unheard (listed in `run --json`'s messages_out); {todo}", file=node.file if node else None, line=node.line if node else None,
                         element_id=eid, severity="warning")
            thrown_elsewhere = only(name, throws, ("throws", "throw"))
            for pid, eid in (c for c in catches.get(name, []) if c[0] in running and thrown_elsewhere):
                node = self.nodes.get(eid)
                if node is None or node.tag not in ("startEvent", "intermediateCatchEvent") or (
                        node.tag == "startEvent" and node.element.getparent().tag != _bpmn("process")):
                    continue  # a boundary event or an event sub-process waits aside: the path goes on
                begins = node.tag == "startEvent"
                self.add("signal_from_other_process", f"signal {'start' if begins else 'catch'} event {eid!r} of "
                         f"process {pid!r} waits for signal {name!r}, which {thrown_elsewhere}, and layerflow runs "
                         f"{main!r} alone, carrying no signal from another instance: "
                         + ("an instance starts waiting at" if begins else "the instance waits at")
                         + f" {eid!r} until the signal is sent to it (`layerflow send INSTANCE_ID {quoted} --signal "
                         "--data PAYLOAD`, or POST /api/instances/{id}/events)"
                         + ("; to start at once with the data given to `layerflow run --data`, draw a plain start "
                            "event in its place" if begins else ""),
                         file=node.file, line=node.line, element_id=eid, severity="warning")

    def _check_called_event_subprocesses(self, main: str | None) -> None:
        """A message or signal event sub-process of a process that ``main`` calls never starts: SpiffWorkflow
        3.2 delivers those to the event sub-processes of the top-level process only (a warning: run on
        its own, that process catches them)."""
        by_id = {p.id: p for p in self.processes}
        for pid, call_id in self._called_from(main).items():
            proc = by_id[pid]
            for sub, start, kind in _message_event_subprocesses(proc.element):
                self.add("called_event_subprocess_never_starts", f"event sub-process {sub.get('id')!r} of "
                         f"process {pid!r} starts on a {kind}, and {pid!r} runs here as a called process "
                         f"(call activity {call_id!r}): SpiffWorkflow 3.2 starts such event sub-processes "
                         f"in the top-level process only, so {start.get('id')!r} never catches it; catch the "
                         f"{kind} with a boundary event on {call_id!r}, or in an event sub-process of "
                         f"{main!r}", file=proc.file, line=start.sourceline, element_id=start.get("id"),
                         severity="warning")

    def _check_event_subprocess(self, sub: Any, file: str) -> None:
        """SpiffWorkflow 3.2 parses message, signal, timer and conditional start events only (any
        other runs as a start event with no trigger, at once; layerflow's parser reads error and
        escalation starts of event sub-processes too); it starts an event sub-process by a
        message or signal only at the top level of the process it runs. (It does not read
        isInterrupting either; layerflow does: ``spiff.LayerflowInterruptingEventStart``.)"""
        sid = sub.get("id")
        for start in sub.iterchildren(_bpmn("startEvent")):
            eid = start.get("id")
            kinds = [etree.QName(c).localname.removesuffix("EventDefinition") for c in start
                     if isinstance(c.tag, str) and c.tag.endswith("EventDefinition")]
            other = [{"compensate": "compensation"}.get(k, k) for k in kinds
                     if k not in ("message", "signal", "timer", "conditional", "error", "escalation")]
            if other:
                self.add("unsupported_start_event", f"start event {eid!r} of event sub-process {sid!r} has a {other[0]} "
                         "trigger, and SpiffWorkflow 3.2 reads no such trigger on a start event: it would start "
                         f"{sid!r} at once, whenever its scope starts, without any {other[0]}; start it with a "
                         "message, signal, timer, conditional, error or escalation event instead (e.g. an error or "
                         "escalation that the steps to undo throw)", file=file, line=start.sourceline, element_id=eid)
                continue
            if "error" in kinds and start.get("isInterrupting") == "false":
                self.add("error_start_non_interrupting", f"error start event {eid!r} of event sub-process {sid!r} has "
                         'isInterrupting="false", and an error start event always interrupts its scope (BPMN): it '
                         f"runs as interrupting; remove the attribute, or throw and catch an escalation to let the "
                         "scope go on", file=file, line=start.sourceline, element_id=eid, severity="warning")
            parent = sub.getparent()
            if any(k in ("message", "signal") for k in kinds) and parent is not None and parent.tag != _bpmn("process"):
                self.add("event_subprocess_never_starts", f"event sub-process {sid!r} is inside "
                         f"bpmn:{etree.QName(parent).localname} {parent.get('id')!r}, and SpiffWorkflow 3.2 starts an "
                         f"event sub-process by a {kinds[0]} only at the top level of the process: {eid!r} would never "
                         f"catch it; move {sid!r} to the process, or catch the {kinds[0]} with a boundary event on "
                         f"{parent.get('id')!r}", file=file, line=start.sourceline, element_id=eid)
                continue
            if start.get("isInterrupting", "true") != "false" and parent is not None:
                self._check_thrown_after_interrupt(sub, parent, file)

    def _check_thrown_after_interrupt(self, sub: Any, scope: Any, file: str) -> None:
        """Once an interrupting event sub-process started, the rest of its process is over, its other
        event sub-processes too: a message or signal it throws itself starts none of them
        (``spiff._InterruptAwareEvents``). Drawn so, it was most likely meant to."""
        def named(event: Any, definition: Any, kind: str) -> tuple[str, str] | None:
            # SpiffWorkflow names a message or signal without a ref after its event (None without a name)
            ref = definition.get(f"{kind}Ref")
            return (kind, f"ref:{ref}") if ref else (kind, f"name:{event.get('name')}") if event.get("name") else None

        starts: dict[tuple[str, str], str] = {}
        for other in scope.iterchildren(_bpmn("subProcess")):
            if other.get("triggeredByEvent") == "true" and other is not sub:
                for start in other.iterchildren(_bpmn("startEvent")):
                    for kind in ("message", "signal"):
                        for d in start.iterchildren(_bpmn(f"{kind}EventDefinition")):
                            key = named(start, d, kind)
                            if key is not None:
                                starts.setdefault(key, str(other.get("id")))
        for throw in sub.iter(_bpmn("intermediateThrowEvent"), _bpmn("endEvent")):
            for kind in ("message", "signal"):
                for d in throw.iterchildren(_bpmn(f"{kind}EventDefinition")):
                    key = named(throw, d, kind)
                    started = starts.get(key) if key is not None else None
                    if started is not None:
                        self.add("event_subprocess_after_interrupt", f"{throw.get('id')!r} in interrupting event "
                                 f"sub-process {sub.get('id')!r} throws the {kind} "
                                 f"{d.get(f'{kind}Ref') or throw.get('name')!r} that would start "
                                 f"event sub-process {started!r}: once {sub.get('id')!r} started, the rest of its process "
                                 f"is cancelled, {started!r} with it, so the {kind} starts nothing here; make "
                                 f"{sub.get('id')!r} non-interrupting (isInterrupting=\"false\"), or do what "
                                 f"{started!r} does in {sub.get('id')!r} itself", file=file, line=throw.sourceline,
                                 element_id=throw.get("id"), severity="warning")

    def _check_thrown_at_person(self, event: Any, eid: str, file: str) -> None:
        """An error or escalation boundary event on a person's step catches what nothing there throws:
        an answer throws nothing (Camunda's task forms throw either, REST /task/{id}/bpmnError), a
        pre- or postScript raising BpmnError throws an error, and no script throws an escalation."""
        attached = event.get("attachedToRef")
        scope = event.getparent()
        task = next((t for t in (scope.iterchildren() if scope is not None else ()) if t.get("id") == attached), None)
        step = {"userTask": "user task", "manualTask": "manual task", "task": "task"}.get(
            etree.QName(task).localname if task is not None else "")
        cfg = self.merged.get(str(attached))
        if task is None or step is None or (cfg is not None and (cfg.handler or cfg.llm is not None)):
            return  # (a step run by a handler or a model throws by raising BpmnError)
        scripts = " ".join(s.text or "" for s in task.iter()
                           if isinstance(s.tag, str) and etree.QName(s).localname in ("preScript", "postScript"))
        after = [f.get("targetRef") for f in _outgoing(event)]
        path = f"{after[0]!r}" if after else "its path"
        forms = " (Camunda's task forms do)" if step == "user task" else ""
        for kind in ("error", "escalation"):
            definition = event.find(_bpmn(f"{kind}EventDefinition"))
            if definition is None or (kind == "error" and "BpmnError" in scripts):
                continue
            ref = definition.get(f"{kind}Ref")
            caught = next((c for c in event.getroottree().getroot().iter(_bpmn(kind))
                           if ref and c.get("id") == ref), None)
            code = caught.get(f"{kind}Code") if caught is not None else None
            key = _identifier_for(event.get("name") or f"{kind}_{code or 'raised'}")
            gateway = (f"draw an exclusive gateway after {attached!r} with a flow to {path} whose condition reads the "
                       f"answer (e.g. {key}), and take the boundary event away")
            if kind == "error":
                thrown = f'BpmnError("{code}")' if code else 'BpmnError("CODE")'
                todo = (f"raise {thrown} in a spiffworkflow:postScript of {attached!r} when the answer says so "
                        f"('if {key}: raise {thrown}'; the task's writes are dropped as it throws, README \"Activities "
                        f"that throw BPMN errors\"), or {gateway}")
            else:
                todo = f"no script throws an escalation: {gateway}"
            self.add("boundary_never_thrown", f"{kind} boundary event {eid!r} on {step} {attached!r} catches "
                     f"{f'{kind} {code!r}' if code else f'any {kind}'}, and a person's answer throws no BPMN {kind} "
                     f"here{forms}: {path} never runs; {todo}", file=file, line=event.sourceline,
                     element_id=eid, field=f"{kind}Ref", severity="warning")

    def _check_cancel(self, event: Any, eid: str, file: str) -> None:
        """A cancel boundary event belongs on a transaction; SpiffWorkflow refuses it elsewhere, naming
        only the activity it is attached to."""
        attached = event.get("attachedToRef")
        parent = event.getparent()
        target = next((n for n in parent.iterchildren() if n.get("id") == attached), None) if parent is not None else None
        if target is None or target.tag == _bpmn("transaction"):
            return
        self.related.add(attached)
        self.add("cancel_outside_transaction", f"cancel boundary event {eid!r} is attached to "
                 f"bpmn:{etree.QName(target).localname} {attached!r}, and a cancel event belongs to a bpmn:transaction "
                 f"(SpiffWorkflow refuses it anywhere else): make {attached!r} a transaction that a cancel end event "
                 "inside it ends, or catch an error or escalation event instead", file=file, line=event.sourceline,
                 element_id=eid, field="attachedToRef")

    def _check_compensation(self, event: Any, eid: str, tag: str, file: str) -> None:
        """SpiffWorkflow 3.2 has no compensation: it cannot load a compensation boundary event, and
        reads a compensation throw or end event as a plain one, so the undo never runs and the
        process completes as if it had. (A compensation start of an event sub-process is
        ``unsupported_start_event``.)"""
        self.related.add(eid)
        # an event sub-process for compensation has no flow to draw into (its start is refused apart)
        handlers = [el.get("id") for el in event.getroottree().iter(*(_FLOW_NODES - _NOT_ACTIVITIES))
                    if el.get("isForCompensation") == "true" and el.get("triggeredByEvent") != "true"]
        associated = [a.get("targetRef") for a in event.getroottree().iter(_bpmn("association"))
                      if a.get("sourceRef") == eid and a.get("targetRef") in handlers]
        handlers = associated or handlers  # a boundary event's handler is the one it is associated with
        undo = f" ({', '.join(map(repr, handlers))})" if handlers else ""
        what = ("SpiffWorkflow cannot load a compensation boundary event" if tag == "boundaryEvent" else
                "SpiffWorkflow reads a compensation throw as a plain event, so no compensation handler runs and "
                "the process goes on as if it had been compensated")
        self.add("compensation_unsupported", f"bpmn:{tag} {eid!r} is a compensation event, and SpiffWorkflow 3.2 "
                 f"runs no compensation: {what}; draw the undo as part of the flow instead: sequence flows from "
                 f"the failure path through the undo tasks{undo} (set isForCompensation=\"false\" on them), or an "
                 "error boundary event on a sub-process whose path does the undo", file=file, line=event.sourceline,
                 element_id=eid)

    def _check_starts(self, scope: Any, file: str) -> None:
        """SpiffWorkflow starts a (sub-)process with several start events at the first one to fire and
        cancels the others: a start event with no trigger fires at once, so the starts after it never do."""
        starts = list(scope.iterchildren(_bpmn("startEvent")))
        if not starts:
            self._check_no_start(scope, file)
            return
        plain = [s for s in starts if not any(isinstance(c.tag, str) and c.tag.endswith("EventDefinition")
                                              for c in s)]
        if len(starts) < 2 or not plain:
            return
        first = plain[0].get("id")
        targets: dict[str, set[str]] = {}
        for flow in scope.iterchildren(_bpmn("sequenceFlow")):
            targets.setdefault(flow.get("sourceRef") or "", set()).add(flow.get("targetRef") or "")
        looped = {el.get("id") for el in scope.iterchildren() if el.find(_bpmn("multiInstanceLoopCharacteristics"))
                  is not None}
        for start in (s for s in starts if s is not plain[0]):
            sid = start.get("id")
            fix = ("to run both paths draw one start event and a parallel gateway after it" if start in plain else
                   f"to wait for {sid!r}'s trigger make it the only start event of its process, or the start of an "
                   "event sub-process")
            # the cancelled start's path into a multi-instance activity the first start enters too breaks
            # SpiffWorkflow's start ("Attempt to add non-predicted child to predicted task")
            shared = sorted(targets.get(sid or "", set()) & targets.get(first or "", set()) & looped)
            breaks = (f"; and as both enter multi-instance activity {shared[0]!r}, SpiffWorkflow cannot even "
                      "start the process (WorkflowException: Attempt to add non-predicted child to predicted task): "
                      f"remove {sid!r} or its flow to {shared[0]!r}" if shared else "")
            self.add("start_event_never_runs", f"start event {sid!r} never runs: {scope.get('id')!r} has "
                     f"{len(starts)} start events and SpiffWorkflow starts it at the first one to fire, {first!r} "
                     "(it has no trigger, so it fires at once), and cancels the others, here and in SpiffWorkflow; "
                     f"{fix}{breaks}", file=file, line=start.sourceline, element_id=sid,
                     severity="error" if shared else "warning")

    def _check_no_start(self, scope: Any, file: str) -> None:
        """SpiffWorkflow starts a process or sub-process at its start event and refuses one without
        ("No start event found", "Exactly one start event is required in a SubWorkflow Task")."""
        kind = etree.QName(scope).localname
        if kind == "process" and scope.get("isExecutable", "true") != "true" and any(
                _executable(p.element) for p in self.processes):
            return  # not run (another is): process_not_executable says so when it is the one chosen
        targets = {f.get("targetRef") for f in scope.iterchildren(_bpmn("sequenceFlow"))}
        first = [el.get("id") for el in scope.iterchildren(*_FLOW_NODES)
                 if el.get("id") not in targets and etree.QName(el).localname != "boundaryEvent"
                 and el.get("triggeredByEvent") != "true" and not _inbound(el)]
        receivers = [el for el in scope.iterchildren(_bpmn("receiveTask"))
                     if el.get("instantiate") == "true" and el.get("id") in first] if kind == "process" else []
        if receivers:
            # BPMN's instantiating receive task, which SpiffWorkflow reads as a plain receive task
            for el in receivers:
                rid, ref = el.get("id"), el.get("messageRef")
                start = (f'<bpmn:startEvent id="{rid}"><bpmn:messageEventDefinition '
                         f'{f"messageRef={chr(34)}{ref}{chr(34)} " if ref else ""}/></bpmn:startEvent>')
                self.add("no_start_event", f"bpmn:{kind} {scope.get('id')!r} has no start event: its bpmn:receiveTask "
                         f"{rid!r} has instantiate=\"true\", which in BPMN starts the process when its message "
                         "arrives, but SpiffWorkflow ignores instantiate and begins a process only at a start event "
                         "(it refuses this one: \"No start event found\"): write a message start event with the same "
                         f"messageRef in place of the receive task, {start}, and keep its outgoing flows"
                         + ("" if ref else " (the receive task names no messageRef: give the start event the "
                            "bpmn:message it waits for)"),
                         file=file, line=el.sourceline, element_id=rid)
            self.related.add(scope.get("id") or "")  # SpiffWorkflow's "No start event found" says no more
            return
        where = (f" to {' and '.join(map(repr, first))} (no flow leads there)" if first
                 else " to the step the process begins with")
        self.add("no_start_event", f"bpmn:{kind} {scope.get('id')!r} has no start event, and SpiffWorkflow begins a "
                 f"{'process' if kind == 'process' else 'sub-process'} at its start event: draw a bpmn:startEvent in "
                 f"it and a sequence flow from it{where}", file=file, line=scope.sourceline,
                 element_id=scope.get("id"))

    def _check_implementation(self, el: Any, eid: str, tag: str, file: str) -> None:
        cfg = self.merged.get(eid)
        if cfg is None and any(p.element_id == eid and p.code.startswith("invalid_config") for p in self.problems):
            return  # its config was refused (that error names the field): what it gives is unknown, not missing
        handled = cfg is not None and (bool(cfg.handler) or cfg.llm is not None)
        if tag == "businessRuleTask":
            self._check_decision(el, eid, file, handled)
            return
        # a gateway's llm: block tunes its condition question or its join's arbiter, and without a
        # model its expressions or a person decide: no step waits there for a handler
        if handled and cfg is not None and cfg.llm is not None and not cfg.llm.model and not cfg.handler \
                and eid not in REGISTRY and not tag.endswith("Gateway"):
            name = _TASK_NAMES.get(tag, f"bpmn:{tag}")
            self.add("llm_without_handler", f"{name} {eid!r} has an llm: block with no model "
                     "and no handler: it runs only when a model is given (--model NAME); without one the instance "
                     f"stops with an error there. Set llm.model, or give it an offline handler (handler: "
                     f"file.py:function, or @activity({eid!r}) in Python)", file=file, line=el.sourceline,
                     element_id=eid, severity="warning")
        if handled or eid in REGISTRY:  # registered already by code that ran before validate
            return
        if tag == "scriptTask" and not _condition_text(el, "script"):
            elsewhere = _written_elsewhere(el, "script")
            what = f"has no script (an empty or missing bpmn:script{'; ' + elsewhere if elsewhere else ''})"
        elif tag == "serviceTask":
            operator = el.find(f"{_bpmn('extensionElements')}/{{{SPIFF_NS}}}serviceTaskOperator")
            if operator is not None and operator.get("id") in REGISTRY:
                return  # the connector registered under the operator's name runs it
            what = ("has no handler" if operator is None else
                    f"has a spiffworkflow:serviceTaskOperator {operator.get('id')!r} and no handler is registered "
                    f"under that name (@activity({operator.get('id')!r}) gets its parameters in ctx.params)")
            if operator is None and el.get("operationRef"):
                what += _operation_called(el)
        else:
            return
        if self.config_unread:  # the handler may well be in the file: say why none was found
            self.add("no_implementation", f"{_TASK_NAMES[tag]} {eid!r} {what}, and the config file "
                     f"{self.config_unread} could not be read (see its error), so no handler or llm: block of it "
                     "was seen; fix the file", file=file, line=el.sourceline, element_id=eid, severity="warning")
            return
        self.add("no_implementation", f"{_TASK_NAMES[tag]} {eid!r} {what}, and its config gives no handler or "
                 f"llm: unless a handler is registered for {eid!r} in Python (@activity({eid!r})), the instance "
                 f"stops with an error there; set handler: file.py:function (or an llm: block) in its config"
                 f"{', or write its Python script' if tag == 'scriptTask' else ''}", file=file, line=el.sourceline,
                 element_id=eid, severity="warning")

    def _check_decision(self, el: Any, eid: str, file: str, handled: bool) -> None:
        ref = dmn.decision_ref(el)
        result = dmn.result_variable(el)
        if ref is not None and result is not None and result[1] not in (*dmn.RESULT_MAPPINGS, "decision"):
            self.add("dmn_result_mapping", f"business rule task {eid!r} has camunda:mapDecisionResult "
                     f"{result[1]!r}, which Camunda does not define: write one of "
                     + "; ".join(f"{name} ({what})" for name, what in dmn.RESULT_MAPPINGS.items())
                     + " (or leave it out: resultList)", file=file, line=el.sourceline, element_id=eid,
                     field="camunda:mapDecisionResult")
        if ref is not None and result is not None and result[0] in self.system_keys:
            attribute = "zeebe:calledDecision resultVariable" if result[1] == "decision" else "camunda:resultVariable"
            self.add("dmn_result_variable", f"business rule task {eid!r} puts its decision's result in {result[0]!r} "
                     f"({attribute}), which the config's system: fixes in L0 SYSTEM: no activity may write it, so "
                     "the instance would stop there; name another resultVariable", file=file, line=el.sourceline,
                     element_id=eid, field=attribute)
        if ref is None:
            if not handled:
                self.related.add(eid)
                self.add("business_rule_without_dmn", f"business rule task {eid!r} names no DMN decision: name it "
                         "(<spiffworkflow:calledDecisionId> in its extensionElements, or camunda:decisionRef) and "
                         "give the .dmn file (`layerflow run PROCESS.bpmn DECISION.dmn`, or put it beside the "
                         "process), or give the task a handler (handler: file.py:function) or an llm: block in its "
                         "config", file=file, line=el.sourceline, element_id=eid)
            return
        defined = {f.decision: f for f in self.dmn_files}
        if ref in defined:
            if any(p.file == str(defined[ref].path) and p.severity == "error" for p in self.problems):
                # the DMN file's problem is said there: SpiffWorkflow's failure at this task says no more
                self.related.add(eid)
            self._check_required_decisions(el, eid, ref, defined[ref], file)
            return
        self.related.add(eid)
        elsewhere = next((f for f in self.dmn_files if ref in {d for d, _ in f.decisions}), None)
        whole = next((f for f in self.dmn_files if f.root is not None and f.root.get("id") == ref), None)
        if elsewhere is None and whole is not None:
            ids = [d for d, _ in whole.decisions]
            there = (f"the decision{'s' if len(ids) > 1 else ''} there: {', '.join(map(repr, ids))}" if ids
                     else "it defines no decision")
            first = ids[0] if ids else "DECISION_ID"
            how = (f"{ref!r} is the id of {whole.path}'s definitions (the whole DMN file), not of a decision: a "
                   f"business rule task names one decision by its id ({there}); write "
                   f"<spiffworkflow:calledDecisionId>{first}</spiffworkflow:calledDecisionId> (camunda:decisionRef "
                   "too, if it is there)")
        elif elsewhere is not None:
            how = (f"{elsewhere.path} defines it after {elsewhere.decision!r}, and SpiffWorkflow 3.2 reads the first "
                   "decision of a DMN file only: put it in a file of its own")
        else:
            given = ", ".join(str(f.path) for f in self.dmn_files)
            how = (f"no DMN file given or beside the process defines it ({'given: ' + given if given else 'none given'})"
                   "; give the .dmn file that does: `layerflow run PROCESS.bpmn DECISION.dmn`, or put it beside the "
                   "process")
        self.add("business_rule_without_dmn", f"business rule task {eid!r} runs DMN decision {ref!r}, but {how}",
                 file=file, line=el.sourceline, element_id=eid, field="calledDecisionId")

    def _check_required_decisions(self, el: Any, eid: str, ref: str, found: dmn.DmnFile, file: str) -> None:
        """A decision that requires others (its informationRequirement: a decision requirements
        graph, as Camunda and Operaton evaluate it): SpiffWorkflow 3.2 runs the one decision and
        not the ones it requires, so the inputs they give have no value (NameError at the first
        rule). Each must be run by a business rule task of its own, before this one."""
        run = {r for doc in self.docs if doc.root is not None
               for r in map(dmn.decision_ref, doc.root.iter(_bpmn("businessRuleTask"))) if r}
        for required in dmn.required_decisions(found.root, ref):
            if required in run:
                continue
            source = next((f for f in self.dmn_files if required in {d for d, _ in f.decisions}), found)
            outputs = dmn.decision_outputs(source.root, required)
            names = ", ".join(map(repr, outputs))
            gives = f", the one that gives {names}" if outputs else ""
            self.related.add(eid)
            self.add("dmn_unsupported", f"business rule task {eid!r} runs DMN decision {ref!r}, which requires "
                     f"decision {required!r} (its informationRequirement){gives}; SpiffWorkflow 3.2 evaluates no "
                     f"required decision, so {names or 'what it gives'} {'have' if len(outputs) > 1 else 'has'} no "
                     f"value and the run stops at the first rule: run {required!r} in a business rule task of its own "
                     f"before {eid!r} (each decision in a DMN file of its own)", file=file, line=el.sourceline,
                     element_id=eid, field="calledDecisionId")

    def _check_call_mappings(self, el: Any, eid: str, file: str) -> bool:
        """A call activity's camunda:in / camunda:out (Operaton's, Activiti's, Flowable's). A mapping
        from one variable to another (source="isValid" target="orderValid", or a sourceExpression that
        only names a variable) runs (``engine.call_mappings``); ``variables="all"`` is what happens
        anyway (the called process runs in its caller's context); a sourceExpression that computes
        something is another engine's expression, which nothing evaluates, so its target is never set:
        an error where the files read it, else a warning. True when every in/out element is one of
        these (the general "another engine's settings" warning then leaves them out)."""
        run = call_mappings.renames(el)  # (held: an lxml element's id lasts as long as its proxy)
        executed = {id(child) for _, _, _, child in run}
        for direction, source, target, child in run:
            if target in self.system_keys:
                mapping = _foreign_name(child.tag) or f"camunda:{direction}"
                self.add("call_mapping_system", f"call activity {eid!r} has {mapping} source={source!r} "
                         f"target={target!r}, a key the config's system: fixes in L0 SYSTEM: no activity may "
                         f"write it, so the instance would stop at {eid!r}"
                         f"{' after the called process ran' if direction == 'out' else ''}; name another target",
                         file=file, line=child.sourceline, element_id=eid, field=mapping)
        handled = True
        for ext in el.iterfind(_bpmn("extensionElements")):
            for child in ext:
                name = _foreign_name(child.tag) if isinstance(child.tag, str) else None
                if name is None or not name.endswith((":in", ":out")) or id(child) in executed:
                    continue
                source, target = (child.get("source") or "").strip(), (child.get("target") or "").strip()
                expression = (child.get("sourceExpression") or "").strip()
                if (child.get("variables") or "").strip() == "all" or (source and source == target) or (
                        expression and _bare_juel_name(expression) == target):
                    continue  # every variable crosses under its own name (${x} to x too: the callee reads x)
                key = (child.get("businessKey") or "").strip()
                if key and name.endswith(":in") and not source and not expression:
                    # what Camunda Modeler adds to pass the caller's business key: said on its own, so
                    # the warning does not read as if the renames beside it did not run either
                    self.add("foreign_extension", f"call activity {eid!r} has {name} businessKey={key!r}: "
                             "layerflow has no business key (an instance is known by its id), so nothing is "
                             "passed; the called process runs in its caller's context and reads its variables, "
                             "so keep what the business key stood for in a variable (in the start data, or set "
                             "by a step before the call)", file=file, line=child.sourceline, element_id=eid,
                             field=f"{name} businessKey", severity="warning")
                    continue
                if expression and target:
                    read = self._reads_name(target, child)
                    self.related.add(eid)
                    dialect = "JUEL" if expression[:2] in ("${", "#{") and expression.endswith("}") else None
                    instead = _python_instead(expression, dialect) if dialect else "rewrite it as a Python expression"
                    hook = "preScript" if name.endswith(":in") else "postScript"
                    self.add("call_mapping_expression", f"call activity {eid!r} has {name} "
                             f"sourceExpression={expression!r} target={target!r}, another engine's expression that "
                             f"layerflow does not evaluate, so nothing sets {target!r}"
                             f"{', and the run stops where it is read' if read else ''}: set it in a "
                             f"spiffworkflow:{hook} of {eid!r} ({target} = ...; {instead})", file=file,
                             line=child.sourceline, element_id=eid, field=name, severity="error" if read else "warning")
                    continue
                handled = False  # a businessKey, a mapping without a target: said generally
        return handled

    def _check_io_mappings(self, el: Any, eid: str, tag: str, file: str) -> bool:
        """An activity's input and output mappings (camunda:inputOutput, zeebe:ioMapping): one that
        names a variable, follows a path into an object or gives a literal runs (``engine.io_mappings``);
        one that computes something, runs a script or sets a path into an object is not run, so its
        target is never set: an error where the files read the target, else a warning, with the
        Python to write in a pre- or postScript. True when the element has mappings."""
        found = io_mappings.mappings(el)
        self._check_mapping_system(found, eid, tag, file)
        for mapping in (m for m in found if m.python is None):
            self.related.add(eid)
            target, hook = mapping.target, "preScript" if mapping.direction == "input" else "postScript"
            if mapping.source.strip() == "script" and self._script_setting_variables(mapping, eid, tag, hook, file):
                continue
            read = target.isidentifier() and self._reads_name(target, mapping.element)
            source = mapping.source.strip()
            expression = (source[:2] in ("${", "#{") and source.endswith("}")) if mapping.dialect == "JUEL" \
                else source.startswith("=")
            if expression:
                instead = _python_instead(source, mapping.dialect)
            elif source == "script":
                instead = "write what the script computes in Python"
            elif mapping.dialect == "JUEL" and io_mappings.template_python(mapping.source) is not None:
                instead = f"write {io_mappings.template_python(mapping.source)}"
            else:
                instead = "write the value as a Python expression"
            if target.isidentifier():
                assign = f"{target} = ..."
            elif target and all(p.strip().isidentifier() for p in target.split(".")):
                head, *keys = [p.strip() for p in target.split(".")]
                assign = f"{head}{''.join(f'[{k!r}]' for k in keys)} = ..., {head} being a dict"
            else:
                assign = "a variable name = ..."
            value = f"{mapping.field} {target!r}" if mapping.dialect == "JUEL" else \
                f"{mapping.field} source={source!r} target={target!r}"
            if mapping.dialect == "JUEL":
                value += f" = {source!r}" if source != "script" else " (a camunda:script)"
            self.add("io_mapping_expression", f"bpmn:{tag} {eid!r} has {value}: {mapping.why}, so nothing sets "
                     f"{target!r}{', and the run stops where it is read' if read else ''}; set it in a "
                     f"spiffworkflow:{hook} of {eid!r} ({assign}; {instead})", file=file,
                     line=mapping.element.sourceline, element_id=eid, field=mapping.field,
                     severity="error" if read else "warning")
        return bool(found)

    def _script_setting_variables(self, mapping: io_mappings.Mapping, eid: str, tag: str, hook: str,
                                  file: str) -> bool:
        """A mapping's camunda:script that sets variables of its own (``execution.setVariable("x", 5)``,
        as Camunda's loan-granting example does): what it sets is what the process reads, not the
        parameter (the script's value); say the Python of those assignments. False for any other script."""
        code = next((c for c in mapping.element if isinstance(c.tag, str) and etree.QName(c).localname == "script"),
                    None)
        text = (code.text or "").strip() if code is not None else ""
        instead = _camunda_script_instead(text) if "setVariable" in text else None
        if code is None or not instead:
            return False
        names = re.findall(r"setVariable(?:Local)?\(\s*['\"]([A-Za-z_]\w*)['\"]", text)
        read = any(self._reads_name(name, mapping.element) for name in names)
        only_setters = len(names) == len([line for line in text.splitlines() if line.strip()])
        value = ", null: setVariable returns nothing" if only_setters else \
            ", its last one: set it there too if a step reads it"
        self.add("io_mapping_expression", f"bpmn:{tag} {eid!r} has {mapping.field} {mapping.target!r} (a "
                 f"camunda:script in {code.get('scriptFormat') or 'no scriptFormat'!r}), which layerflow does not "
                 f"run: its camunda:script sets {', '.join(map(repr, dict.fromkeys(names)))} (execution.setVariable, "
                 f"Camunda's process API), so nothing sets {'them' if len(set(names)) > 1 else 'it'}"
                 f"{' and the run stops where it is read' if read else ''}; write {instead!r} in a "
                 f"spiffworkflow:{hook} of {eid!r} (the parameter {mapping.target!r} itself holds the script's value"
                 f"{value})",
                 file=file, line=mapping.element.sourceline, element_id=eid, field=mapping.field,
                 severity="error" if read else "warning")
        return True

    def _check_mapping_system(self, found: list[io_mappings.Mapping], eid: str, tag: str, file: str) -> None:
        """Mappings that run and write a key the config's system: fixes: the write is denied at the
        element (as a call activity's camunda:out into one is, ``call_mapping_system``), so the instance
        would stop there. A mapping of a variable to itself writes nothing and is left alone."""
        for mapping in found:
            head = mapping.target.split(".")[0].strip()
            if mapping.python is None or head not in self.system_keys or io_mappings.identity(mapping):
                continue
            value = f"{mapping.field} {mapping.target!r}" if mapping.dialect == "JUEL" else \
                f"{mapping.field} source={mapping.source.strip()!r} target={mapping.target!r}"
            when = "as it fires" if tag.endswith("Event") else \
                "before its work" if mapping.direction == "input" else "after its work"
            self.add("io_mapping_system", f"bpmn:{tag} {eid!r} has {value}, which writes {head!r}, a key the "
                     f"config's system: fixes in L0 SYSTEM: no activity may write it, so the instance would stop at "
                     f"{eid!r} {when}; name another target (and read that one where {head!r} was read)",
                     file=file, line=mapping.element.sourceline, element_id=eid, field=mapping.field)

    def _check_event_mappings(self, el: Any, eid: str, tag: str, file: str) -> bool:
        """Input and output mappings of an event. Its outputs that name a variable, follow a path or
        give a literal run as it fires (a start event's, a message catch event's renaming of what the
        message brought: ``engine.spiff``); its inputs (a throw event's) and the outputs that compute
        something never run, and their targets are never set. An error where the files read the
        target (a condition, a script, another mapping), else a warning, with the script task to draw
        and its Python. True when the element has mappings."""
        found = io_mappings.mappings(el) if tag.endswith("Event") else []
        self._check_caught_variables(el, eid, tag, file)
        self._check_mapping_system([m for m in found if m.direction == "output"], eid, tag, file)
        for mapping in (m for m in found if (m.direction == "input" or m.python is None) and not io_mappings.identity(m)):
            self.related.add(eid)
            target = mapping.target
            read = target.isidentifier() and self._reads_name(target, mapping.element)
            where = "after" if mapping.direction == "output" else "before"
            shown = io_mappings.assignment(mapping)
            if shown is not None:
                python = f"that sets it: {shown}"
            else:
                source = mapping.source.strip()
                python = f"that sets it ({_python_instead(source, mapping.dialect)})" if source.startswith(
                    ("=", "${", "#{")) else "that sets it"
            value = f"{mapping.field} target={target!r}" if mapping.dialect == "FEEL" else f"{mapping.field} {target!r}"
            why = ("an event runs no script before it fires, so its input mappings never run" if mapping.direction
                   == "input" else f"{mapping.why}, so it never runs")
            self.add("io_mapping_on_event", f"bpmn:{tag} {eid!r} has {value}: {why}, and nothing "
                     f"sets {target!r}{', and the run stops or reads null where it is read' if read else ''}; "
                     f"draw a bpmn:scriptTask {where} {eid!r} {python}", file=file, line=mapping.element.sourceline,
                     element_id=eid, field=mapping.field, severity="error" if read else "warning")
        return bool(found)

    def _check_caught_variables(self, el: Any, eid: str, tag: str, file: str) -> None:
        """Camunda 7's variables that a catch event sets to the error (escalation) it caught
        (``io_mappings.caught``) and that are not set here: the event names no error with a code, so
        which one it caught is known only then, or the error's message is an expression. An error
        where the files read one of them (the run stops there), else a warning."""
        unset = [m for m in io_mappings.caught(el) if m.python is None]
        self._check_mapping_system([m for m in io_mappings.caught(el) if m.python is not None], eid, tag, file)
        for definition in dict.fromkeys(m.element for m in unset):
            these = [m for m in unset if m.element is definition]
            kind = etree.QName(definition).localname.removesuffix("EventDefinition")
            read = [m.target for m in these if m.target.isidentifier() and self._reads_name(m.target, definition)]
            named = ", ".join(f"{m.field}={m.target!r}" for m in these)
            todo = (f"give its bpmn:{kind}EventDefinition an {kind}Ref naming the bpmn:{kind} (with an {kind}Code) "
                    f"it catches, and layerflow sets them as it catches" if "every" in these[0].why else
                    f"give the bpmn:{kind}'s message as text, or set {these[0].target!r} in a script after {eid!r}")
            self.add("caught_variable_not_set", f"bpmn:{tag} {eid!r} has {named}, the variables Camunda sets to the "
                     f"{kind} it caught, and nothing sets them here: {these[0].why}"
                     f"{f'; the run stops where {read[0]!r} is read' if read else ''}; {todo}", file=file,
                     line=definition.sourceline, element_id=eid, field=these[0].field,
                     severity="error" if read else "warning")

    def _reads_name(self, name: str, besides: Any = None) -> bool:
        """A condition, script or variable mapping (other than ``besides``) of the files given reads
        variable ``name`` (by the word: a guess that errs on the side of reading)."""
        word = re.compile(rf"(?<![\w.'\"]){re.escape(name)}(?![\w'\"])")
        tags = {"conditionExpression", "condition", "script", "completionCondition", "loopCardinality"}
        mapped = {"inputParameter", "outputParameter", "input", "output", "in", "out"}  # another mapping's source
        return any(word.search(el.text or "") for doc in self.docs if doc.root is not None
                   for el in doc.root.iter() if isinstance(el.tag, str)
                   and etree.QName(el).localname in tags | {"preScript", "postScript"}) or any(
            word.search(el.get("source") or el.get("sourceExpression") or el.text or "")
            for doc in self.docs if doc.root is not None for el in doc.root.iter()
            if isinstance(el.tag, str) and el is not besides and etree.QName(el).localname in mapped
            and (etree.QName(el).namespace or "") in {**io_mappings.NAMESPACES, **call_mappings.NAMESPACES})

    def _check_timer_settings(self, el: Any, eid: str, tag: str, file: str) -> None:
        """Activiti's and Flowable's settings of a timer (``activiti:endDate`` on a timeCycle: the
        date the repetitions stop; ``businessCalendarName``: a duration counted in a business
        calendar's working hours): SpiffWorkflow reads the ISO 8601 text only, so the timer fires
        otherwise than the file says."""
        for definition in el.iterchildren(_bpmn("timerEventDefinition")):
            for holder in (definition, *(c for c in definition if isinstance(c.tag, str))):
                for name, value in holder.attrib.items():
                    qn = etree.QName(name)
                    prefix = _ENGINE_NAMESPACES.get(qn.namespace or "")
                    if prefix is None:
                        continue
                    setting = f"{prefix}:{qn.localname}"
                    if qn.localname == "endDate":
                        meant = ("sets the date its repetitions stop, and here the cycle repeats as many times as its R<n> "
                                 "says (for ever when there is no n), whatever the date: give the count in the "
                                 "cycle (R5/PT10S), or end the waiting by another path")
                    elif qn.localname == "businessCalendarName":
                        meant = ("names the calendar whose working hours the time is counted in, and here it is "
                                 "counted in plain time, round the clock: write the time as plain time")
                    else:
                        meant = "changes how the timer fires, and here it fires by its ISO 8601 text alone: remove it"
                    self.add("foreign_extension", f"timer {eid!r} (bpmn:{tag}) has {setting}={value!r}, another "
                             f"engine's timer setting that layerflow does not run (nor does SpiffWorkflow): it "
                             f"{meant}", file=file, line=holder.sourceline, element_id=eid, field=setting,
                             severity="warning")

    def _check_terminate_scope(self, el: Any, eid: str, file: str) -> None:
        """A terminate end event in a sub-process that another engine makes end the whole instance
        (Flowable's and Activiti's terminateAll, jBPM's scope="process"): BPMN, SpiffWorkflow and
        layerflow end only the sub-process, and the process goes on after it."""
        scope = next((a for a in el.iterancestors() if a.tag in (*_SCOPES, _bpmn("adHocSubProcess"))), None)
        if scope is None:
            return  # at the top level of the process both end the instance
        engines = {**_ENGINE_NAMESPACES, _JBPM_NS: "jbpm"}
        for definition in el.iterchildren(_bpmn("terminateEventDefinition")):
            for name, value in definition.attrib.items():
                qn = etree.QName(name)
                engine = engines.get(qn.namespace or "")
                if engine is None or (qn.localname, value.strip()) not in (("terminateAll", "true"),
                                                                             ("scope", "process")):
                    continue
                written = next((k for k, v in definition.nsmap.items() if v == qn.namespace and k), engine)
                sid, start = scope.get("id"), scope.find(_bpmn("startEvent"))
                if scope.get("triggeredByEvent") == "true" and start is not None:
                    if start.get("isInterrupting") != "false" and scope.getparent().tag == _bpmn("process"):
                        continue  # an interrupting one has cancelled the rest of the process already
                    what = f"event sub-process {sid!r} and the rest of its scope goes on"
                    instead = ('make the event sub-process interrupting (isInterrupting="true" on its start event '
                               f"{start.get('id')!r}): it cancels the rest of its scope, which ends with it")
                else:
                    what = f"sub-process {sid!r} and the process goes on after it"
                    instead = (f"end {sid!r} with an error end event and draw an error boundary event on {sid!r} "
                               "that leads to a terminate end event of the process")
                owner = {"jbpm": "jBPM", "bpmnos": "BPMN-OS"}.get(engine, engine.capitalize())
                self.add("foreign_extension", f"terminate end event {eid!r} has {written}:{qn.localname}={value!r}: "
                         f"{owner} ends the whole process instance there, while layerflow (as BPMN says, and "
                         f"SpiffWorkflow) ends only {what}; to end the instance, {instead}",
                         file=file, line=definition.sourceline, element_id=eid, field=f"{written}:{qn.localname}",
                         severity="warning")

    def _check_jbpm(self, el: Any, eid: str, tag: str, file: str) -> None:
        """jBPM's settings of a step: its on-entry and on-exit scripts (Java, MVEL or JavaScript, run
        as the step starts and ends, as a pre- and postScript are), which nothing runs here; and a
        work item task (``drools:taskName``), which jBPM's work item handler runs and which here is a
        plain task that waits for a person."""
        for ext in el.iterfind(_bpmn("extensionElements")):
            for holder in ext:
                if not isinstance(holder.tag, str) or etree.QName(holder).namespace != _JBPM_NS:
                    continue
                local = etree.QName(holder).localname
                if local not in ("onEntry-script", "onExit-script"):
                    continue
                code = " ".join("".join(s.itertext()) for s in holder if isinstance(s.tag, str)).strip()
                sets = list(dict.fromkeys(_KCONTEXT_SET.findall(code)))
                read = [name for name in sets if self._reads_name(name, holder)]
                hook, when = ("preScript", "starts") if local == "onEntry-script" else ("postScript", "ends")
                stops = (f", and it sets {read[0]!r}, which the files read: the run stops where it is read"
                         if read else "")
                todo = (f"write it in Python as a spiffworkflow:{hook} of {eid!r}"
                        f"{' (' + '; '.join(f'{name} = ...' for name in sets) + ')' if sets else ''}")
                self.add("jbpm_script_not_run", f"bpmn:{tag} {eid!r} has drools:{local} (scriptFormat="
                         f"{holder.get('scriptFormat') or 'none'!r}: {_shorten(code)!r}), jBPM's script run as the "
                         f"step {when}, which layerflow does not run (nor does SpiffWorkflow){stops}; {todo}", file=file,
                         line=holder.sourceline, element_id=eid, field=f"drools:{local}",
                         severity="error" if read else "warning")
        item = el.get(f"{{{_JBPM_NS}}}taskName")
        cfg = self.merged.get(eid)
        if tag == "task" and item and not (cfg is not None and (cfg.handler or cfg.llm is not None)):
            self.add("foreign_extension", f"bpmn:task {eid!r} is jBPM's work item {item!r} (drools:taskName), which "
                     "jBPM's work item handler runs; here it is a plain task, which waits for a person's answer: "
                     f"{_RUN_BY_HANDLER}", file=file, line=el.sourceline, element_id=eid, field="drools:taskName",
                     severity="warning")

    def _check_listeners(self, proc: _Node) -> None:
        """Another engine's execution listeners where no step is: on a process (run as an instance
        starts or ends) and on a sequence flow (run as it is taken). SpiffWorkflow runs none, and no
        handler runs there: what they do (set a variable, call a service) does not happen. The ones
        on a step or a sub-process are reported with its other settings (``_check_foreign``)."""
        for el in proc.element.iter(_bpmn("process"), _bpmn("sequenceFlow")):
            tag, eid = etree.QName(el).localname, el.get("id") or "(no id)"
            names = [q for ext in el.iterfind(_bpmn("extensionElements")) for child in ext
                     if isinstance(child.tag, str) for q in [_foreign_name(child.tag)]
                     if q and q.partition(":")[2] in ("executionListener", "executionListeners")]
            if not names:
                continue
            if tag == "sequenceFlow":
                what = f"sequence flow {eid!r} has {names[0]}, run as the flow is taken"
                sets = [found for ext in el.iterfind(_bpmn("extensionElements")) for child in ext
                        if isinstance(child.tag, str) and etree.QName(child).localname == "executionListener"
                        for found in [_juel_set_variables(child.get("expression") or "")]]
                if sets and all(sets):
                    # ${execution.setVariable('orderStatus', 'FAILED')}: what it does is known, so is the script
                    set_names = ", ".join(repr(n) for _, values in filter(None, sets) for n in values)
                    script = "\n".join(python for python, _ in filter(None, sets))
                    what += f", that sets {set_names} (execution.setVariable)"
                    todo = (f"draw a bpmn:scriptTask on the flow, from {el.get('sourceRef')!r} to "
                            f"{el.get('targetRef')!r}, whose script is {script!r}")
                else:
                    todo = (f"draw a script task (or a task with a handler) on the flow, from {el.get('sourceRef')!r} "
                            f"to {el.get('targetRef')!r}, that does the listener's work")
            else:
                what = f"process {eid!r} has {names[0]}, run as an instance starts or ends"
                todo = "do the listener's work in a task after the start event (or before the end event)"
            self.add("foreign_extension", f"{what}: another engine's listener that layerflow does not run (nor "
                     f"does SpiffWorkflow's own parser), so what it does never happens; {todo}", file=proc.file,
                     line=el.sourceline, element_id=eid, field=names[0], severity="warning")

    @staticmethod
    def _listener_assignments(el: Any, eid: str, tag: str) -> list[str]:
        """What to write for the execution listeners of ``el`` whose expression only sets variables
        (``${execution.setVariable('finished', true)}``): the assignment, in the pre- or postScript of
        an activity, else in a script task drawn before (a 'start' listener) or after (an 'end' one)."""
        said, others = [], 0
        for ext in el.iterfind(_bpmn("extensionElements")):
            for child in ext:
                if not isinstance(child.tag, str) or etree.QName(child).localname != "executionListener":
                    continue
                sets = _juel_set_variables(child.get("expression") or "")
                if sets is None:
                    others += 1
                    continue
                event = child.get("event") or "start"
                if tag in _MAPPED_TAGS:
                    where = f"a spiffworkflow:{'preScript' if event == 'start' else 'postScript'} of {eid!r}"
                else:
                    where = f"a bpmn:scriptTask drawn {'before' if event == 'start' else 'after'} {eid!r}"
                said.append(f"its executionListener (event {event!r}) sets {', '.join(map(repr, sets[1]))} "
                            f"(execution.setVariable): write {sets[0]!r} in {where}")
        return said + ["do the other listeners' work in a task of the process"] if said and others else said

    def _check_foreign(self, el: Any, eid: str, tag: str, file: str) -> None:
        """Another engine's settings that decide what a step does: SpiffWorkflow ignores them, silently."""
        found: dict[str, None] = {}
        loop = el.find(_bpmn("multiInstanceLoopCharacteristics"))
        for holder in (el, loop):
            for name in (holder.attrib if holder is not None else {}):
                found.update({q: None for q in [_foreign_name(name)] if q})
        for ext in (e for holder in (el, loop) if holder is not None for e in holder.iterfind(_bpmn("extensionElements"))):
            for child in ext:
                # (an XML comment or processing instruction among them is no setting)
                found.update({q: None for q in [_foreign_name(child.tag) if isinstance(child.tag, str) else None] if q})
        if tag == "businessRuleTask":
            # Camunda 7's decisionRef and resultVariable and Camunda 8's calledDecision are run here
            found = {q: None for q in found if q != "zeebe:calledDecision"}
        if tag == "callActivity" and self._check_call_mappings(el, eid, file):
            found = {q: None for q in found if not q.endswith((":in", ":out"))}  # run, or said above
        if (self._check_io_mappings(el, eid, tag, file) if tag in _MAPPED_TAGS
                else self._check_event_mappings(el, eid, tag, file)):
            found = {q: None for q in found if not q.endswith((":inputOutput", ":ioMapping"))}  # run, or said
        if tag != "scriptTask":
            found = {q: None for q in found if not q.endswith(":resultVariable")}  # with the class or decision it serves
        for definition in el.iterfind(_bpmn("messageEventDefinition")):
            # the payload of a thrown message as Camunda writes it (SpiffWorkflow's CamundaParser reads
            # it; its catching events then hold it as <event id>_Response): here nothing reads it
            for name in [q for q in map(_foreign_name, definition.attrib) if q and q.endswith(":expression")]:
                self.add("foreign_extension", f"bpmn:{tag} {eid!r}: its bpmn:messageEventDefinition has {name}, "
                         "the message's payload in another engine's terms, which layerflow (a SpiffWorkflow "
                         "parser) does not read: the message goes out with no payload; write the payload as a "
                         "Python expression in a spiffworkflow:messagePayload in the messageEventDefinition's "
                         "extensionElements, and a spiffworkflow:messageVariable where it is caught", file=file,
                         line=definition.sourceline, element_id=eid, field=name, severity="warning")
        if loop is not None and loop.find(_bpmn("loopDataInputRef")) is None and loop.find(_bpmn("loopCardinality")) is None:
            # Camunda 7 (Activiti, Flowable): attributes of the loop; Camunda 8: a zeebe:loopCharacteristics in it
            zeebe = loop.find(f"{_bpmn('extensionElements')}/{{http://camunda.org/schema/zeebe/1.0}}loopCharacteristics")
            names = {(_foreign_name(k) or "").partition(":")[2]: (_foreign_name(k), v) for k, v in loop.attrib.items()}
            if zeebe is not None:
                names = {"collection": ("zeebe:loopCharacteristics inputCollection", zeebe.get("inputCollection", "")),
                         "elementVariable": ("inputElement", zeebe.get("inputElement", "")),
                         "outputCollection": ("outputCollection", zeebe.get("outputCollection", "")),
                         "outputElement": ("outputElement", zeebe.get("outputElement", ""))}
            if "collection" in names:
                self._foreign_collection(loop, names, eid, tag, file)
                found = {q: None for q in found if not q.endswith((":collection", ":elementVariable",
                                                                   ":loopCharacteristics"))}
            else:  # a modeler's bare marker (the MIWG models): said here, before isExecutable is set
                self.add("spiff_validation", f"SpiffWorkflow cannot load the process: bpmn:{tag} {eid!r} is a "
                         "multi-instance activity that says neither how many instances run nor over what (a "
                         "multi-instance task must specify a cardinality or a loop input data reference); write "
                         "<bpmn:loopCardinality>3</bpmn:loopCardinality> (an expression over the context) or "
                         "<bpmn:loopDataInputRef>COLLECTION</bpmn:loopDataInputRef> and <bpmn:inputDataItem "
                         "id=\"ITEM\" name=\"ITEM\"/> in its bpmn:multiInstanceLoopCharacteristics, or remove it to "
                         "run the step once", file=file, line=el.sourceline, element_id=eid)
        elif loop is not None:
            # operaton:collection='${items}' beside <loopDataInputRef>items</...> (as validate asks to write)
            # says what runs already: only a setting that disagrees with them is worth a word
            again = _loop_said_again(loop)
            found = {q: None for q in found if q.partition(":")[2] not in again}
        cfg = self.merged.get(eid)
        if cfg is not None and (cfg.handler or cfg.llm is not None) and tag not in _NOT_WORKED:
            # the step is run by its handler (or model): what the other engine ran it by is moot
            found = {q: None for q in found if _FOREIGN_SETTINGS[q.partition(":")[2]] != _RUN_BY_HANDLER}
        operators = [o.get("expression", "") for o in el.iterfind(f".//{{{_BPMNOS_NS}}}operator")]
        if not operators:
            found.pop("bpmnos:status", None)  # attributes and restrictions alone change nothing as it runs
        if not found:
            return
        todo = list(dict.fromkeys(_FOREIGN_SETTINGS[q.partition(":")[2]] for q in found))
        todo = [f"its operators ({', '.join(map(repr, operators))}) are not applied; {t}"
                if t == _FOREIGN_SETTINGS["status"] else t for t in todo]
        starter = next((v for k, v in el.attrib.items() if (_foreign_name(k) or "").endswith(":initiator")), None)
        if starter:
            todo = [f"it names the variable ({starter!r}) that the engine sets to the user who started the "
                    f"instance; nothing sets it here: give {starter!r} in the start data (--data)"
                    if t == _FOREIGN_SETTINGS["initiator"] else t for t in todo]
        listened = self._listener_assignments(el, eid, tag)
        if listened:
            todo = ["; ".join(listened) if t == _FOREIGN_SETTINGS["executionListener"] else t for t in todo]
        resource = next(((k, v.strip()) for k, v in el.attrib.items()
                         if (_foreign_name(k) or "").endswith(":resource") and v.strip()), None)
        language = (el.get("scriptFormat") or "").strip()
        if resource is not None and (language.lower() not in ("", "python") or not resource[1].endswith(".py")):
            # a script of another language in a file of the deployment: no copy of it is Python
            qname = etree.QName(resource[0])
            written = next((k for k, v in el.nsmap.items() if v == qname.namespace and k), "camunda")
            kind = _SCRIPT_LANGUAGES.get(language.lower(), "")
            todo = [f"its {written}:resource={resource[1]!r} names a file of the other engine's deployment holding "
                    f"the script in scriptFormat {language or 'none'!r}{f' ({kind})' if kind else ''}; layerflow "
                    "runs Python scripts only: write what it computes in Python as the task's bpmn:script (or give "
                    "the task a handler: handler: file.py:function in its config)"
                    if t == _FOREIGN_SETTINGS["resource"] else t for t in todo]
        decision = _engine_dmn_task(el)
        if decision is not None:
            # Flowable's (Activiti's) DMN task: a service task of type "dmn" that names its decision
            # in a field; layerflow runs a decision from a business rule task
            key = repr(decision) if decision else "the decision"
            todo = [f"it runs DMN decision {key} (the {_foreign_name_of_type(el)}=\"dmn\" task and its "
                    "decisionTableReferenceKey field): draw a bpmn:businessRuleTask instead, with "
                    f"camunda:decisionRef=\"{decision or 'DECISION_ID'}\" (or <spiffworkflow:calledDecisionId>), and "
                    "give the .dmn file (`layerflow run PROCESS.bpmn DECISION.dmn`, or put it beside the process)"]
        payload = _event_payload_todo(el, eid, tag)
        if payload is not None:
            todo = [payload if t == _MAP_IN_CODE else t for t in todo]
        if tag in ("sendTask", "receiveTask"):
            # no handler runs there (handler_not_run): its work goes in a task of its own
            todo = [_NOT_WORKED[tag][1] if t == _RUN_BY_HANDLER else t for t in todo]
        script = el.find(f"{_bpmn('extensionElements')}/{{http://camunda.org/schema/zeebe/1.0}}script")
        written = el.find(_bpmn("script"))
        if script is not None and written is not None and (written.text or "").strip():
            # the export carries both: SpiffWorkflow runs the bpmn:script, Camunda 8 the zeebe:script
            todo = ["its bpmn:script runs in the zeebe:script's place (the zeebe:script is Camunda 8's; check "
                    "that both compute the same)" if t == _FOREIGN_SETTINGS["script"] else t for t in todo]
        elif script is not None and (script.get("expression") or "").strip().startswith("=") \
                and script.get("resultVariable"):
            # Camunda 8's one-line script: a FEEL expression whose value lands in resultVariable
            instead = _python_instead(script.get("expression", ""), "FEEL")
            if instead.startswith("write '"):
                expression, notes = _written_and_notes(instead[len("write "):])
                line = f"{script.get('resultVariable')} = {expression}"
                todo = [f"write {line!r} as its bpmn:script{notes}" if t == _FOREIGN_SETTINGS["script"] else t
                        for t in todo]
        delegate = next(((q, v.strip(), m) for k, v in el.attrib.items() for q in [_foreign_name(k)]
                         if q and q.endswith((":delegateExpression", ":expression"))
                         for m in [_JUEL_BEAN.fullmatch(v.strip())] if m), None)
        if delegate is not None and _RUN_BY_HANDLER in todo:
            # a JUEL expression naming a bean (#{archiveService}) or calling its method
            # (#{jobAnnouncementService.postToWebsite(jobAnnouncementId)}) of the other engine's
            # application: say what it names, the code to bring over as the handler
            attr, value, found_bean = delegate
            bean, method = found_bean.group(1), found_bean.group(2)
            sets = _juel_set_variables(value) if bean == "execution" else None
            if sets is not None:
                # ${execution.setVariable('foo', 'bar')} (Camunda's model API example): Camunda's process API,
                # not a bean; the step's whole work is the assignment
                script, returns = sets
                said = (f"its {attr}={value!r} is a JUEL expression that sets {', '.join(map(repr, returns))} "
                        "through Camunda's process API (execution.setVariable), which is not here: make "
                        f"{eid!r} a bpmn:scriptTask whose script is {script!r}, or register a handler for "
                        f"{eid!r} that returns {{{', '.join(f'{k!r}: {v}' for k, v in returns.items())}}}")
            elif method is None and bean in _JUEL_LITERALS:
                # ${true} (Operaton's and Camunda's test models): a literal names no bean; the
                # other engine evaluates it and the step does nothing
                said = (f"its {attr}={value!r} is a JUEL literal ({bean}): the other engine evaluates it and "
                        "does nothing else, so the step does no work there; make it a bpmn:scriptTask whose "
                        f"script is `pass` (a bpmn:task waits for a person), or register a handler for {eid!r} "
                        "that returns nothing")
            else:
                named = (f"calling {method}() of {bean!r}, a Java bean" if method
                         else f"naming {bean!r}, a Java bean")
                said = (f"its {attr}={value!r} is a JUEL expression ({_dialect_said(value, 'JUEL')}) {named} of "
                        "the other engine's application that does the step's work; write that work in Python as "
                        f"the step's handler (handler: file.py:function in the config for {eid!r}) or give it an "
                        "llm: block")
            todo = [said if t == _RUN_BY_HANDLER else t for t in todo]
        # (SpiffWorkflow's CamundaParser reads some camunda: settings, a multi-instance collection among
        # them; layerflow parses as SpiffWorkflow's own parser does, which reads none)
        self.add("foreign_extension", f"bpmn:{tag} {eid!r} has {', '.join(map(_as_written(el), found))}, another "
                 "engine's settings that "
                 f"layerflow does not run (nor does SpiffWorkflow's own parser): {'; '.join(todo)}", file=file,
                 line=el.sourceline, element_id=eid, severity="warning")

    def _foreign_collection(self, loop: Any, names: dict[str, tuple[str | None, str]], eid: str, tag: str,
                            file: str) -> None:
        """A multi-instance loop over another engine's collection (camunda:collection, Camunda 8's
        zeebe:loopCharacteristics) and nothing BPMN's: SpiffWorkflow refuses a loop with neither a
        loopDataInputRef nor a cardinality; say what to write, with the names this loop uses."""
        self.related.add(eid)

        def plain(key: str, default: str) -> str:
            text = names.get(key, (None, ""))[1].strip()
            if text[:2] in ("${", "#{") and text.endswith("}"):
                text = text[2:-1].strip()
            return text.lstrip("=").strip() if text.lstrip("=").strip().isidentifier() else default

        what, collection = names["collection"]
        item = plain("elementVariable", "ITEM")
        write = (f"<bpmn:loopDataInputRef>{plain('collection', 'COLLECTION')}</bpmn:loopDataInputRef> and "
                 f"<bpmn:inputDataItem id=\"{item}\" name=\"{item}\"/>")
        same = ""
        if "outputCollection" in names and names["outputCollection"][1]:
            out = plain("outputElement", "OUTPUT_ITEM")
            if out == item:
                # each instance's own item is collected: the two items cannot share an id (ids are
                # unique), and SpiffWorkflow names an item by its id
                out = f"{item}_out"
                same = (f" (ids are unique and SpiffWorkflow names an item by its id, so the output item is not "
                        f"{item!r}: each instance sets {out!r} ({out} = {item} at the end of its script, or in a "
                        f"spiffworkflow:postScript with spiffworkflow:scriptsOnInstances=\"true\" on the loop)")
            write += (f", <bpmn:loopDataOutputRef>{plain('outputCollection', 'OUTPUT')}</bpmn:loopDataOutputRef> and "
                      f"<bpmn:outputDataItem id=\"{out}\" name=\"{out}\"/>")
        self.add("multi_instance_foreign_collection", f"bpmn:{tag} {eid!r} is a multi-instance activity over "
                 f"{what}={collection!r}, another engine's setting that SpiffWorkflow does not read, and it has no "
                 "bpmn:loopDataInputRef or bpmn:loopCardinality, so SpiffWorkflow cannot load it: write "
                 f"{write} in its bpmn:multiInstanceLoopCharacteristics{same}", file=file, line=loop.sourceline,
                 element_id=eid, field="loopDataInputRef")

    def _check_data_items(self, el: Any, eid: str, tag: str, file: str) -> None:
        """A multi-instance item, or a task's data input or output, is the variable its id names; a
        modeler's generated id (DataInput_1) beside the name the scripts use fails at run time."""
        loop = el.find(_bpmn("multiInstanceLoopCharacteristics"))
        io = el.find(_bpmn("ioSpecification"))
        assigned = self._check_assigned_inputs(el, io, eid, tag, file)
        found = [(kind, item, who) for holder, who in ((loop, "each instance"), (io, "the task"))
                 if holder is not None
                 for kind in ("inputDataItem", "outputDataItem", "dataInput", "dataOutput")
                 for item in holder.iterfind(_bpmn(kind))]
        for kind, item, who in found:
            item_id, name = item.get("id"), item.get("name")
            if item_id in assigned:
                continue  # refused whole above: renaming its id would not give it a value
            if not name or name == item_id or not name.isidentifier():
                continue  # a name no script can write ("parcel to weigh") is a label, not a variable
            what = f"{who} reads" if kind in ("inputDataItem", "dataInput") else f"{who} must set"
            self.add("data_item_named_apart", f"bpmn:{tag} {eid!r}: its bpmn:{kind} has id={item_id!r} and "
                     f"name={name!r}; SpiffWorkflow names the variable by its id, so {what} {item_id!r}, not "
                     f"{name!r}: give it id={name!r} (and use that id where it is referenced)", file=file,
                     line=item.sourceline, element_id=eid, field=kind, severity="warning")

    def _check_assigned_inputs(self, el: Any, io: Any, eid: str, tag: str, file: str) -> set[str]:
        """A task's data inputs that a ``bpmn:assignment`` gives their values (jBPM saves a person's
        task parameters so: TaskName, Skippable, ...). SpiffWorkflow runs no assignment and stops the
        task when an input is not in its data, so the instance could never pass the task. The ids of
        the inputs refused."""
        if io is None:
            return set()
        inputs = {item.get("id"): item for item in io.iterfind(_bpmn("dataInput")) if item.get("id")}
        assigned = [inputs[ref] for assoc in el.iterfind(_bpmn("dataInputAssociation"))
                    if assoc.find(_bpmn("assignment")) is not None
                    for ref in ((r.text or "").strip() for r in assoc.iterfind(_bpmn("targetRef")))
                    if ref in inputs]
        if not assigned:
            return set()
        # BPMN starts a task once one of its input sets is there: an input no bpmn:inputSet lists is
        # not waited for (SpiffWorkflow reads only the listed ones), and the task runs without it
        listed = {(r.text or "").strip() for r in io.iterfind(f"{_bpmn('inputSet')}/{_bpmn('dataInputRefs')}")}
        required = [item for item in assigned if item.get("id") in listed]
        unlisted = [item for item in assigned if item.get("id") not in listed]
        if required:
            shown = ", ".join(repr(item.get("name") or item.get("id")) for item in required)
            self.add("data_input_assignment", f"bpmn:{tag} {eid!r} gives its data input(s) {shown} their values by "
                     "bpmn:assignment (another engine's task parameters, as jBPM saves them), which SpiffWorkflow "
                     f"does not run: the inputs are never set, and the instance would stop at {eid!r} (as plain "
                     "SpiffWorkflow does, 'Missing data input'); remove the task's ioSpecification and "
                     "dataInputAssociations (a person's step needs neither), or set the values in a script before "
                     "the task, with the inputs' ids as names", file=file, line=required[0].sourceline,
                     element_id=eid, field="dataInput")
        if unlisted:
            shown = ", ".join(repr(item.get("name") or item.get("id")) for item in unlisted)
            self.add("data_input_assignment", f"bpmn:{tag} {eid!r} gives its data input(s) {shown} their values by "
                     "bpmn:assignment (another engine's task parameters), which SpiffWorkflow does not run; no "
                     "bpmn:inputSet of its ioSpecification lists them, so the task runs without them and what the "
                     "assignments give never reaches it; set the values in a script before the task, with the "
                     "inputs' ids as names, if the task needs them", file=file, line=unlisted[0].sourceline,
                     element_id=eid, field="dataInput", severity="warning")
        return {item.get("id") for item in assigned}

    def _check_event_definitions(self, el: Any, eid: str, tag: str, file: str) -> None:
        """An event definition BPMN (2.0.2, table 10.93) does not allow on this kind of event, such as a
        timer on a throw event or a terminate on a catch event: SpiffWorkflow 3.2 ignores it (a plain
        event, or a timer a throw event never waits for) and goes straight on, so nothing waits, ends or
        is thrown where the diagram says. Links and compensation have checks of their own
        (``link_misplaced``, ``compensation_unsupported``)."""
        allowed = _EVENT_KINDS_ALLOWED.get(tag)
        if allowed is None:
            return
        event_start = tag == "startEvent" and el.getparent().get("triggeredByEvent") == "true"
        kinds = sorted({k for c in el if isinstance(c.tag, str) and c.tag.endswith("EventDefinition")
                        and (k := etree.QName(c).localname.removesuffix("EventDefinition")) not in allowed
                        and k not in ("link", "compensate") and not (event_start and k in ("error", "escalation"))})
        if not kinds:
            return
        what, does = _EVENT_KIND_NAMES[tag]
        listed = f"{'an' if kinds[0][0] in 'aeiou' else 'a'} {kinds[0]} event definition" if len(kinds) == 1 else \
            f"{', '.join(kinds[:-1])} and {kinds[-1]} event definitions"
        grouped: dict[str, list[str]] = {}
        for kind in kinds:
            grouped.setdefault(_misplaced_todo(kind, tag), []).append(kind)
        todos = list(grouped) if len(kinds) == 1 else [f"{' and '.join(ks)}: {todo}" for todo, ks in grouped.items()]
        self.add("event_definition_misplaced", f"bpmn:{tag} {eid!r} has {listed}, which BPMN allows on no {what} "
                 f"(one {does}): SpiffWorkflow ignores {'it' if len(kinds) == 1 else 'them'}, so the event "
                 f"goes straight on (nothing waits, ends or is thrown there); {'; '.join(todos)}", file=file,
                 line=el.sourceline, element_id=eid)

    def _check_event_refs(self, el: Any, eid: str, tag: str, file: str) -> None:
        """A message or signal catch event that names none: no one can send it (SpiffWorkflow loads it
        and waits for an event named None), so the path after it never runs. A reference that names
        nothing of the file: SpiffWorkflow's parser fails on it with an error of its own."""
        root = el.getroottree().getroot()
        holders = [(el, "messageRef", "message")] if tag in ("sendTask", "receiveTask") else []
        holders += [(d, ref, what) for kind, ref, what in _EVENT_REFS for d in el.iterfind(_bpmn(kind))]
        for holder, ref, what in holders:
            named = holder.get(ref)
            if named is None or (not named and what == "message"):  # SpiffWorkflow reads an empty messageRef as none
                continue
            known = [d.get("id") for d in root.iterfind(_bpmn(what)) if d.get("id")]
            if named in known:
                continue
            self.related.add(eid)
            # Flowable and Activiti read an errorRef (escalationRef) that names no element as the code itself
            carries = f'{what}Code="{named}"' if what in ("error", "escalation") else f'name="{named}"'
            read = (f" (the {'code' if what in ('error', 'escalation') else 'name'} jBPM and Flowable read from "
                    f"{'an' if what[0] in 'ae' else 'a'} {ref} that names no element)")
            self.add("event_ref_unknown", f"bpmn:{tag} {eid!r} has {ref}={named!r}, which is no bpmn:{what} of this "
                     f"file{_did_you_mean(named, known)}; add <bpmn:{what} id=\"{named}\" {carries}/>{read} under "
                     f"bpmn:definitions, or point {ref} at one", file=file, line=holder.sourceline, element_id=eid,
                     field=ref)
        self._check_message_extensions(el, eid, tag, root, file)
        self._check_item_extensions(el, eid, tag, file)
        if tag == "boundaryEvent":
            self._check_attached(el, eid, file)
        self._check_waits_for_something(el, eid, tag, file)
        if tag not in ("startEvent", "intermediateCatchEvent", "boundaryEvent"):
            return
        for kind, ref, what in (("messageEventDefinition", "messageRef", "message"),
                                ("signalEventDefinition", "signalRef", "signal")):
            for definition in el.iterfind(_bpmn(kind)):
                if definition.get(ref):
                    continue
                # SpiffWorkflow names such an event after the element (a signalRef="" too; an empty
                # messageRef is a message it looks for and does not find)
                named = el.get("name") if what == "signal" or definition.get(ref) is None else None
                waits = (f"SpiffWorkflow then waits for a {what} named like the event, {named!r} (`layerflow "
                         f"send` delivers one by that name), which no other engine or modeler sends"
                         if named else "nothing can send it, so it never fires and the path after it never runs")
                expression = next(((f"{_ENGINE_NAMESPACES[q.namespace]}:{q.localname}", v.strip())
                                   for k, v in definition.attrib.items() for q in [etree.QName(k)]
                                   if q.namespace in _ENGINE_NAMESPACES and q.localname == f"{what}Expression"), None)
                if expression is not None:
                    # Flowable's and Activiti's name of the event, computed from a variable
                    setting, value = expression
                    holder = value[2:-1].strip() if value[:2] in ("${", "#{") and value.endswith("}") else value
                    self.add("event_without_ref", f"bpmn:{tag} {eid!r} names its {what} by {setting}={value!r}, "
                             f"the other engine's: the {what} is named by the value of {holder} as the event starts "
                             f"waiting; layerflow does not read it: {waits}; "
                             f'add {ref}="ID" naming a bpmn:{what} whose name is the one {holder} holds '
                             f"(`layerflow send` delivers it by that name)", file=file, line=definition.sourceline,
                             element_id=eid, field=ref, severity="warning")
                    continue
                self.add("event_without_ref", f"bpmn:{tag} {eid!r} waits for a {what} but its bpmn:{kind} names "
                         f'none: {waits}; add {ref}="ID" naming a bpmn:{what} of the file (`layerflow send` '
                         f"delivers it by that {what}'s name)", file=file, line=definition.sourceline,
                         element_id=eid, field=ref, severity="warning")

    def _check_waits_for_something(self, el: Any, eid: str, tag: str, file: str) -> None:
        """A receive task with no message and a catch event with no event definition: SpiffWorkflow
        gives them a none event, which fires at once, so the path never waits there."""
        if tag == "receiveTask" and el.get("messageRef") is None \
                and el.find(_bpmn("messageEventDefinition")) is None:
            what = "names no message (no messageRef)"
            todo = ('add messageRef="ID" naming a bpmn:message of the file (`layerflow send` delivers it by that '
                    "message's name)")
        elif tag == "intermediateCatchEvent" and not any(
                isinstance(child.tag, str) and child.tag.endswith("EventDefinition") for child in el):
            what = "has no event definition"
            todo = ("give it the message, signal, timer or condition it waits for (a bpmn:messageEventDefinition "
                    'with messageRef="ID", ...), or remove it')
        else:
            return
        gateway = _event_gateway_before(el, eid)
        if gateway is not None:
            # one of the gateway's events: a none event, which nothing throws
            effect = (f"after event-based gateway {gateway!r} it is one of the gateway's events, one that nothing "
                      "sends, so the gateway never takes its path")
        else:
            effect = "SpiffWorkflow gives it nothing to wait for, so the path does not wait there and goes straight on"
        self.add("waits_for_nothing", f"bpmn:{tag} {eid!r} {what}: {effect}; {todo}", file=file, line=el.sourceline,
                 element_id=eid, severity="warning")

    def _check_message_extensions(self, el: Any, eid: str, tag: str, root: Any, file: str) -> None:
        """SpiffWorkflow reads a message's payload and variable from its bpmn:message when that holds
        either (the older place), and then ignores the event's own: a messagePayload on the throw
        event goes out as an empty payload, a messageVariable on the catch is never set."""
        definitions = [el] if tag in ("sendTask", "receiveTask") else list(el.iterfind(_bpmn("messageEventDefinition")))
        if tag not in ("sendTask", "receiveTask") and definitions:
            self._check_event_message_extensions(el, eid, tag, file)
        for definition in definitions:
            ref = definition.get("messageRef")
            message = next((m for m in root.iterfind(_bpmn("message")) if ref and m.get("id") == ref), None)
            if message is None:
                continue
            on_message = {name: (found.text or "").strip() for name in _MESSAGE_EXTENSIONS
                          for found in message.iter(f"{{{SPIFF_NS}}}{name}")}
            if not on_message:
                continue
            self._warn_message_extensions_deprecated(message, on_message, root, file)
            for name in _MESSAGE_EXTENSIONS:
                for own in definition.iter(f"{{{SPIFF_NS}}}{name}"):
                    text = (own.text or "").strip()
                    if on_message.get(name) == text:
                        continue
                    read = ", ".join(f"spiffworkflow:{k} {v!r}" for k, v in on_message.items())
                    lost = ("the message goes out with the message's payload instead" if name == "messagePayload"
                            and "messagePayload" in on_message else "the message goes out with an empty payload"
                            if name == "messagePayload" else f"{text!r} is never set")
                    self.add("message_extension_shadowed", f"bpmn:{tag} {eid!r}: its spiffworkflow:{name} {text!r} "
                             f"is never read: its bpmn:message {ref!r} has {read}, and SpiffWorkflow then reads the "
                             f"message's settings only, so {lost}; move the bpmn:message's spiffworkflow:"
                             "messagePayload / messageVariable into the messageEventDefinitions (or send / receive "
                             "tasks) that throw and catch it, where SpiffWorkflow reads them", file=file,
                             line=own.sourceline, element_id=eid, field=name)

    def _check_event_message_extensions(self, el: Any, eid: str, tag: str, file: str) -> None:
        """A messagePayload / messageVariable in a message event's own extensionElements (where a send or
        receive task keeps them): SpiffWorkflow reads an event's from its bpmn:messageEventDefinition."""
        for extensions in el.iterfind(_bpmn("extensionElements")):
            for name in _MESSAGE_EXTENSIONS:
                for own in extensions.iter(f"{{{SPIFF_NS}}}{name}"):
                    text = (own.text or "").strip()
                    lost = ("the message goes out with an empty payload" if name == "messagePayload" else
                            f"{text!r} is never set: the payload's keys are written one by one instead, and a "
                            "payload that is no JSON object is refused")
                    self.add("message_extension_misplaced", f"bpmn:{tag} {eid!r}: its spiffworkflow:{name} {text!r} "
                             f"in the event's own extensionElements is never read, so {lost}; SpiffWorkflow reads "
                             "an event's from its bpmn:messageEventDefinition: move it into <bpmn:extensionElements> "
                             "inside that element", file=file, line=own.sourceline, element_id=eid, field=name)

    def _warn_message_extensions_deprecated(self, message: Any, on_message: dict[str, str], root: Any,
                                            file: str) -> None:
        """A spiffworkflow:messagePayload / messageVariable on the bpmn:message itself: SpiffWorkflow
        3.2 still reads it there, but emits a DeprecationWarning for every event that names the
        message (they "have been moved"); said once per message, with the events to move them to."""
        mid = message.get("id")
        if mid in self._deprecated_messages:
            return
        self._deprecated_messages.add(mid)
        senders: list[str] = []
        catchers: list[str] = []
        for el in root.iter(*(_bpmn(t) for t in _MESSAGE_SENDERS + _MESSAGE_CATCHERS)):
            named = el.get("messageRef") == mid or any(d.get("messageRef") == mid
                                                       for d in el.iterfind(_bpmn("messageEventDefinition")))
            if named and el.get("id"):
                (senders if etree.QName(el).localname in _MESSAGE_SENDERS else catchers).append(repr(el.get("id")))
        moves = []
        if "messagePayload" in on_message:
            moves.append("its spiffworkflow:messagePayload into the bpmn:messageEventDefinition of each event that "
                         f"sends it ({', '.join(senders) or 'none in this file'}; in a bpmn:sendTask's "
                         "extensionElements)")
        if "messageVariable" in on_message:
            moves.append("its spiffworkflow:messageVariable into that of each event that catches it "
                         f"({', '.join(catchers) or 'none in this file'}; in a bpmn:receiveTask's extensionElements)")
        held = " and ".join(f"spiffworkflow:{k}" for k in on_message)
        self.add("message_extension_deprecated", f"bpmn:message {mid!r} holds {held}, a place SpiffWorkflow 3.2 "
                 "still reads but deprecates (a DeprecationWarning: 'spiffworkflow:messagePayload and "
                 "spiffworkflow:messageVariable have been moved' for each event that names it); move "
                 f"{' and '.join(moves)}, and remove {'them' if len(moves) > 1 else 'it'} from the bpmn:message "
                 "(while it holds either, SpiffWorkflow reads the message's only)", file=file, line=message.sourceline, element_id=mid,
                 severity="warning")

    def _check_item_extensions(self, el: Any, eid: str, tag: str, file: str) -> None:
        """A signal's, error's or escalation's payload and variable are read from the bpmn:signal
        (error, escalation) the event names, as SpiffWorkflow's parser reads them; on the event's own
        event definition, where a message's are written, nothing reads them: the signal goes out with
        no payload, and the catch's variable is never set."""
        for kind, ref, what in (("signalEventDefinition", "signalRef", "signal"),
                                ("errorEventDefinition", "errorRef", "error"),
                                ("escalationEventDefinition", "escalationRef", "escalation")):
            for definition in el.iterfind(_bpmn(kind)):
                named = definition.get(ref)
                for name in ("payloadExpression", "variableName"):
                    for own in definition.iter(f"{{{SPIFF_NS}}}{name}"):
                        lost = (f"the {what} goes out without its payload" if name == "payloadExpression"
                                else f"{(own.text or '').strip()!r} is never set where it is caught")
                        where = f"bpmn:{what} {named!r}" if named else f"a bpmn:{what} (name it with {ref})"
                        self.add("event_extension_misplaced", f"bpmn:{tag} {eid!r}: its spiffworkflow:{name} on "
                                 f"bpmn:{kind} is never read, so {lost}: SpiffWorkflow reads a {what}'s "
                                 f"payloadExpression and variableName from the {what} itself; move it into the "
                                 f"extensionElements of {where}", file=file, line=own.sourceline, element_id=eid,
                                 field=name)

    def _check_node_ids(self, proc: _Node) -> None:
        """Flow nodes without an id (BPMN requires one; Flowable's and Activiti's parsers make one up):
        no flow can name them, and SpiffWorkflow files each under the name None, so a second one is
        a duplicate and even one fails as the engine starts the process."""
        for el in proc.element.iter():
            if not isinstance(el.tag, str) or el.tag not in _FLOW_NODES or (el.get("id") or "").strip():
                continue
            tag = etree.QName(el).localname
            starts = [s.get("id") for s in el if s.tag == _bpmn("startEvent") and s.get("id")]
            if tag in ("subProcess", "transaction", "adHocSubProcess") and starts:
                kind = "event sub-process" if el.get("triggeredByEvent") == "true" else f"bpmn:{tag}"
                what, example = f"the {kind} starting at {starts[0]!r}", f"{starts[0]}_subprocess"
            elif el.get("name"):
                what, example = f"bpmn:{tag} {el.get('name')!r}", re.sub(r"\W+", "_", el.get("name")).strip("_")
            else:
                what, example = f"a bpmn:{tag}", f"{tag}_{el.sourceline}"
            self.add("node_id_missing", f"{what} has no id; SpiffWorkflow keys every element by id and cannot start "
                     f"a process with an element that has none: give it an id unique in the file, e.g. "
                     f'id="{example}"', file=proc.file, line=el.sourceline, field="id")

    def _boundary_on_event_subprocess(self, el: Any, eid: str, target: Any, file: str) -> None:
        """A boundary event on an event sub-process (Flowable runs one: it interrupts the event
        sub-process once its event has started it); SpiffWorkflow fails to load it, naming nothing."""
        self.related.add(eid)
        sid = target.get("id")
        start = next((c.get("id") for c in target if c.tag == _bpmn("startEvent")), None)
        steps = [c.get("id") for c in target if isinstance(c.tag, str) and c.tag in _FLOW_NODES
                 and c.tag not in (_bpmn("startEvent"), _bpmn("endEvent")) and c.get("id")]
        inside = f"({', '.join(map(repr, steps))}) " if steps else ""
        self.add("boundary_on_event_subprocess", f"boundary event {eid!r} is attached to event sub-process {sid!r}: "
                 "SpiffWorkflow cannot load a boundary event on an event sub-process (another engine interrupts "
                 f"the event sub-process with it once its event has started it); inside {sid!r}, put its steps "
                 f"{inside}in an embedded sub-process after {start!r} and attach {eid!r} to that sub-process",
                 file=file, line=el.sourceline, element_id=eid, field="attachedToRef")

    def _check_attached(self, el: Any, eid: str, file: str) -> None:
        """SpiffWorkflow finds a boundary event from the activity it is attached to, among the
        elements of that activity's scope (nested ones too): one attached to no activity, or drawn
        outside its activity's scope, is dropped, and the path after it never runs."""
        attached = el.get("attachedToRef")
        process = next(a for a in el.iterancestors() if a.tag == _bpmn("process"))
        activities = {a.get("id"): a for a in process.iter() if isinstance(a.tag, str) and a.tag in _FLOW_NODES
                      and a.tag not in _NOT_ACTIVITIES and a.get("id")}
        target = activities.get(attached or "")
        if target is not None and target.get("triggeredByEvent") == "true":
            self._boundary_on_event_subprocess(el, eid, target, file)
            return
        if target is not None and any(a is target.getparent() for a in el.iterancestors()):
            return
        self.related.add(eid)
        if target is None:
            where = f"which is no activity of this process{_did_you_mean(attached or '', activities)}"
        else:
            where = (f"which is inside sub-process {target.getparent().get('id')!r}, while the event is drawn "
                     "outside it")
        self.add("boundary_not_attached", f"boundary event {eid!r} has attachedToRef={attached!r}, {where}: "
                 "SpiffWorkflow would drop the event and the path after it would never run; attach it to the task, "
                 "sub-process or call activity it watches, beside that activity", file=file, line=el.sourceline,
                 element_id=eid, field="attachedToRef")

    # -- SpiffWorkflow and the schema --------------------------------------------------------

    def _check_spiff(self, main: str | None) -> None:
        from SpiffWorkflow.bpmn.parser.ValidationException import ValidationException

        parser = (self.parser_factory or _default_parser_factory())()
        from .process import branch_conditions

        # the config's branch conditions stand in for missing flow conditions (as in load_process)
        parser.branch_conditions = branch_conditions(self.merged)
        reported = {p.element_id for p in self.problems if p.severity == "error" and p.element_id} | self.related
        failures: list[tuple[BaseException, _Doc | None]] = []
        for found in self.dmn_files:
            try:
                parser.add_dmn_xml(found.root, filename=str(found.path))
            except Exception as failure:  # noqa: BLE001 - SpiffWorkflow's parser refusing the table
                self.add("dmn_invalid", f"SpiffWorkflow cannot read this DMN: {getattr(failure, 'error', failure)}",
                         file=str(found.path), line=getattr(failure, "line_number", None) or None,
                         element_id=getattr(failure, "id", None) or None)
        for doc in self.docs:
            try:
                parser.add_bpmn_xml(etree.fromstring(doc.data, _xml_parser()), filename=doc.file)
            except Exception as failure:  # ValidationException, the engine's LayerflowError, or a parser bug
                failures.append((failure, doc))
        if not failures and main is not None and not any(p.code in _PROCESS_SELECTION_CODES for p in self.problems):
            try:
                if main in getattr(parser, "collaborations", {}) and main not in parser.get_process_ids():
                    parser.get_collaboration(main)
                else:
                    parser.get_spec(main)
                    parser.get_subprocess_specs(main)
            except Exception as failure:
                failures.append((failure, None))
        for err, origin in failures:
            eid = getattr(err, "id", None) or None
            if eid in reported or any(f"'{name}'" in str(err) for name in self.related):
                continue  # already reported with a better message
            if str(err).strip().rstrip(".").endswith(": None") and any(p.code == "node_id_missing" for p in self.problems):
                continue  # "Duplicate process ID: None": an element without an id, each named above
            if "BoundaryEventSplit" in str(err) and any(p.code == "boundary_on_event_subprocess" for p in self.problems):
                continue  # SpiffWorkflow's parser failing on the boundary event named above
            if isinstance(err, LayerflowError) and self.problems:
                continue  # the engine's parser re-raising a config problem reported above
            if self.dmn_ids_missing and "KeyError('id')" in str(err):
                continue  # SpiffWorkflow's DMN parser meeting the element without an id reported above
            retrieval = _retrieval_without_message(err, self.docs)
            if retrieval is not None:
                expr, prop, retrieval_doc = retrieval
                text = (expr.findtext(f".//{_bpmn('formalExpression')}") or
                        expr.findtext(f".//{_bpmn('messagePath')}") or "").strip()
                self.add("correlation_message_missing", f"correlation property {prop.get('id')!r} has a retrieval expression "
                         f"({text!r}) that names no message: SpiffWorkflow cannot load the file; add "
                         "messageRef=\"ID\" naming the bpmn:message whose payload it reads, or remove the "
                         "bpmn:correlationPropertyRetrievalExpression", file=retrieval_doc.file, line=expr.sourceline,
                         element_id=prop.get("id"), field="messageRef")
                continue
            store = _data_store_of(err, self.docs)
            if store is not None:
                # SpiffWorkflow names neither the element nor the file; the store's name finds both
                el, store_doc = store
                named = f"name {el.get('name')!r}" if el.get("name") else "it has no name either"
                used = any(ref.get("dataStoreRef") == el.get("id") for doc in self.docs if doc.root is not None
                           for ref in doc.root.iter(_bpmn("dataStoreReference")))
                todo = ("keep the value in the process context instead (a bpmn:dataObject, or a variable the tasks "
                        "write)" if used else "no bpmn:dataStoreReference names it, so no task reads or writes it "
                        "(a bpmn:association carries no data): remove it and the associations drawn to it")
                self.add("data_store_unsupported", f"bpmn:dataStore {el.get('id')!r} ({named}) has no "
                         "implementation: SpiffWorkflow reads and writes a data store only through a class registered "
                         f"for its name, and layerflow registers none; {todo}", file=store_doc.file,
                         line=el.sourceline, element_id=el.get("id"))
                continue
            node = (self.nodes.get(eid) or self.other_ids.get(eid)) if eid else None
            unresolved = _unresolved_association(err, node, self.docs)
            if unresolved is not None and node is not None:
                association, field, what = unresolved
                self.add("data_store_unsupported" if "data store" in what else "data_ref_unknown",
                         f"bpmn:{node.tag} {node.id!r} {what}", file=node.file, line=association.sourceline,
                         element_id=node.id, field=field)
                continue
            file = getattr(err, "file_name", None) or (node.file if node else origin.file if origin else self._files())
            line = getattr(err, "line_number", None) or (node.line if node else None)
            kind = "" if isinstance(err, (ValidationException, LayerflowError)) else f"{type(err).__name__}: "
            tag = getattr(err, "tag", "") or ""
            text = str(err).strip().rstrip(".?! ")
            self.add("spiff_validation", f"SpiffWorkflow cannot load the process: {kind}{text}"
                     f"{f' (at {tag})' if tag else ''}; fix the BPMN element named here", file=str(file),
                     line=int(line) if isinstance(line, int) or (isinstance(line, str) and line.isdigit()) else None,
                     element_id=eid)

    def _check_schema(self, doc: _Doc) -> None:
        from SpiffWorkflow.spiff.parser.process import VALIDATOR

        tree = etree.fromstring(doc.data, _xml_parser())
        VALIDATOR.preprocess(tree)
        schema = VALIDATOR.validator
        with _SCHEMA_LOCK:  # one shared schema object, and its error_log is that of its last run
            if schema.validate(tree):
                return
            entries = list(schema.error_log)
        taken = {p.line for p in self.problems if p.file == doc.file and p.severity == "error"}
        for entry in entries:
            if entry.line in taken:
                continue  # the same spot already has an error with a better message
            message = entry.message
            for ns, prefix in ((BPMN_NS, "bpmn"), (SPIFF_NS, "spiffworkflow"), (LAYERFLOW_NS, "layerflow")):
                message = message.replace(f"{{{ns}}}", f"{prefix}:")
            message = message.split(" Expected is one of")[0].split(" Expected is (")[0]
            self.add("bpmn_schema", f"does not conform to the BPMN 2.0 schema: {message.rstrip('.')}; "
                     "SpiffWorkflow may ignore or misread this part", file=doc.file, line=entry.line or None,
                     severity="warning")


# ---------------------------------------------------------------------------------------
# helpers


@functools.lru_cache(maxsize=64)
def _handler_file_names(source: bytes, filename: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """(every top-level name, the functions and classes) a handler file defines, by its source; None
    when it star-imports. Cached by content: a process names several handlers of one file (the loan
    demo seven), and parsing it was most of validating that process."""
    tree = ast.parse(source, filename=filename)
    names: set[str] = set()
    functions: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            functions.add(node.name)
            for deco in node.decorator_list:  # @activity("name") registers under that name
                if isinstance(deco, ast.Call):
                    names.update(a.value for a in deco.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return frozenset(names), frozenset(functions)


def _handler_problem(module_ref: str, attr: str, base: Path) -> str | None:
    """What is wrong with a ``module:function`` handler reference, or None when it may load."""
    if not module_ref or not attr:
        return "write file.py:function or package.module:function"
    if not module_ref.endswith(".py"):
        import importlib.util

        try:
            found = importlib.util.find_spec(module_ref)
        except (ImportError, ValueError):
            found = None
        return None if found is not None else f"no module {module_ref!r} can be imported; check the name"
    path = Path(module_ref)
    path = path if path.is_absolute() else base / path
    try:
        defined_here = _handler_file_names(path.read_bytes(), str(path))
    except OSError:
        return f"file {path} not found; paths are relative to the process folder"
    except SyntaxError as err:
        return f"{path.name} line {err.lineno}: {err.msg}; fix the handler file"
    if defined_here is None:
        return None  # a star import: cannot tell without running it
    names, functions = defined_here
    if attr in names:
        return None
    defined = sorted(n for n in functions if not n.startswith("_"))
    return (f"{path.name} defines no {attr!r}{_did_you_mean(attr, names)}; "
            f"its functions: {', '.join(defined) or 'none'}")


def _default_parser_factory() -> Callable[[], Any]:
    """The engine's parser when it is there (validated means loadable the way the engine loads), else stock."""
    import importlib

    try:
        module = importlib.import_module(".spiff", __package__)
    except ImportError:
        module = importlib.import_module("SpiffWorkflow.spiff.parser.process")
        return getattr(module, "SpiffBpmnParser")  # type: ignore[no-any-return]
    return getattr(module, "LayerflowBpmnParser")  # type: ignore[no-any-return]


def _xml_parser() -> Any:
    # No entity expansion, no network: a BPMN file is data, not a fetch instruction.
    return etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)


_CATCHING = frozenset({"intermediateCatchEvent", "receiveTask", "boundaryEvent", "startEvent"})


def _pools(collaboration: Any) -> list[tuple[str, str | None]]:
    """(participant id, its processRef or None) for each pool of a collaboration."""
    return [(p.get("id"), p.get("processRef")) for p in collaboration.iter(_bpmn("participant"))]


def _message_of(element: Any, messages: Mapping[str, str]) -> str | None:
    """The name of the message a flow node sends or waits for (its messageEventDefinition's or its
    own messageRef, as a send or receive task has); None when it has none."""
    definition = element.find(_bpmn("messageEventDefinition"))
    ref = definition.get("messageRef") if definition is not None else element.get("messageRef")
    if ref is None:
        return None
    return str(messages.get(ref, ref))


def _messages_between(collaboration: Any, processes: set[str], nodes: Mapping[str, Any]) -> bool:
    """Whether a message flow of ``collaboration`` joins two of ``processes`` (pools that talk)."""
    pools = dict(_pools(collaboration))

    def process_of(ref: str | None) -> str | None:
        node = nodes.get(ref or "")
        return node.process_id if node is not None else pools.get(ref or "")

    return any(process_of(f.get("sourceRef")) in processes and process_of(f.get("targetRef")) in processes
               and process_of(f.get("sourceRef")) != process_of(f.get("targetRef"))
               for f in collaboration.iter(_bpmn("messageFlow")))


def _startable(process: Any) -> bool:
    """Whether a process has a start event of its own (something can start it)."""
    return process.find(_bpmn("startEvent")) is not None


def _executable(process: Any) -> bool:
    return bool(process.get("isExecutable", "true") == "true")  # SpiffWorkflow's own rule


def _owner_id(ext: Any) -> str | None:
    owner = ext.getparent() if ext is not None and ext.tag == _bpmn("extensionElements") else ext
    return owner.get("id") if owner is not None else None


_JOIN_TAGS = ("parallelGateway", "inclusiveGateway")
# the seed's gateway kinds (its "type": "XOR_SPLIT", "AND_JOIN") -> the BPMN element they name
_SEED_GATEWAY_KINDS = {"XOR": "exclusiveGateway", "EXCLUSIVE": "exclusiveGateway", "AND": "parallelGateway",
                       "PARALLEL": "parallelGateway", "OR": "inclusiveGateway", "INCLUSIVE": "inclusiveGateway",
                       "EVENT": "eventBasedGateway", "EVENT_BASED": "eventBasedGateway"}



def _event_gateway_before(el: Any, eid: str) -> str | None:
    """The id of the event-based gateway a sequence flow of ``el``'s level leads from to ``eid``."""
    level = el.getparent()
    gateways = {g.get("id") for g in level.iterfind(_bpmn("eventBasedGateway"))}
    return next((f.get("sourceRef") for f in level.iterfind(_bpmn("sequenceFlow"))
                 if f.get("targetRef") == eid and f.get("sourceRef") in gateways), None)


_UNBOUND_PREFIX = re.compile(r"Namespace prefix (\S+) for (\S+) on (\S+) is not defined")


def _element_at(data: bytes, line: int, tag: str) -> str | None:
    """The id of the element named ``tag`` at ``line`` of a file whose namespaces are not
    well-formed (read again leniently), or of the nearest element around it that has one."""
    try:
        root = etree.fromstring(data, etree.XMLParser(recover=True, resolve_entities=False, no_network=True))
    except etree.XMLSyntaxError:
        return None
    if root is None:
        return None
    for el in root.iter():
        if el.sourceline == line and isinstance(el.tag, str) and etree.QName(el).localname == tag:
            while el is not None and el.get("id") is None:
                el = el.getparent()
            return el.get("id") if el is not None else None
    return None


#: the methods a context value (JSON: an object, a list, text, a number) has
_JSON_METHODS = frozenset(name for kind in (dict, list, str, int, float, bool) for name in dir(kind))


def _foreign_method_calls(tree: ast.AST) -> list[str]:
    """``DateTime.AddDays()`` for each call of a method on a capitalised name (a class of another
    language's API: .NET's DateTime, Java's LocalDate) that no JSON value has."""
    return sorted({f"{n.func.value.id}.{n.func.attr}()" for n in ast.walk(tree)
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and isinstance(n.func.value, ast.Name) and n.func.value.id[:1].isupper()
                   and not hasattr(builtins, n.func.value.id) and n.func.attr not in _JSON_METHODS})

_CHOICES = ("exclusiveGateway", "eventBasedGateway")


def _choice_behind(flow: Any) -> tuple[str, str] | None:
    """(id of the exclusive or event-based gateway, id of its outgoing flow) that ``flow`` comes
    from through nodes with one way in and one way out each (a link's jump is one), or through a
    parallel split (one way in: each of its flows carries a token exactly when that way does),
    else None."""
    scope = flow.getparent()
    if scope is None:
        return None
    nodes = {n.get("id"): n for n in scope.iterchildren() if n.get("id")}
    seen: set[str] = set()
    source = nodes.get(flow.get("sourceRef"))
    while source is not None and source.get("id") not in seen:
        seen.add(source.get("id"))
        outgoing = _outgoing(source)
        if etree.QName(source).localname in _CHOICES and len(outgoing) > 1:
            return source.get("id"), flow.get("id")
        inbound = _inbound(source)
        one_way_on = len(outgoing) + len(_jump_targets(source)) == 1 or source.tag == _bpmn("parallelGateway")
        if len(inbound) != 1 or not one_way_on or source.get("attachedToRef"):
            return None
        source, via = inbound[0]
        flow = via if via.tag == _bpmn("sequenceFlow") else flow
    return None


def _successors(node: Any) -> list[Any]:
    """The nodes a path goes on to from ``node``: the targets of its outgoing flows and, from a link
    throw event, the link's catch event, which no flow reaches (``engine.links``). Every walk along
    the paths takes this step, so none stops at a link."""
    scope = node.getparent()
    if scope is None:
        return []
    targets = {f.get("targetRef") for f in _outgoing(node)}
    return [el for el in scope.iterchildren() if el.get("id") in targets] + _jump_targets(node)


def _jump_targets(node: Any) -> list[Any]:
    """The link catch events a link throw event jumps to (none for any other node)."""
    return links.catch_of(node) if links.is_link_throw(node) else []


def _inbound(node: Any) -> list[tuple[Any, Any]]:
    """How paths reach ``node``: (source node, the flow) per incoming flow whose source exists, and
    (throw, throw) per link throw event that jumps to it."""
    scope = node.getparent()
    if scope is None:
        return []
    by_id = _scope_index(scope)[0]
    found = [(by_id[f.get("sourceRef")], f) for f in _incoming(node) if f.get("sourceRef") in by_id]
    if links.is_link_catch(node):
        found += [(t, t) for t in scope.iterchildren(_bpmn("intermediateThrowEvent")) if node in _jump_targets(t)]
    return found


@functools.lru_cache(maxsize=32)
def _scope_index(scope: Any) -> tuple[dict[str, Any], dict[str, list[Any]], dict[str, list[Any]]]:
    """A process's or sub-process's children by id, and its sequence flows by source and by target,
    in document order: asked for each node, a scan of the scope made validate quadratic in the
    size of the process (validate never changes the tree it reads)."""
    by_id: dict[str, Any] = {}
    by_source: dict[str, list[Any]] = {}
    by_target: dict[str, list[Any]] = {}
    for el in scope.iterchildren():
        if el.get("id"):
            by_id[el.get("id")] = el
        if el.tag == _SEQUENCE_FLOW:
            by_source.setdefault(el.get("sourceRef"), []).append(el)
            by_target.setdefault(el.get("targetRef"), []).append(el)
    return by_id, by_source, by_target


def _parallel_multi_scope(node: Any) -> bool:
    """A sub-process or call activity whose instances run in parallel, each in a scope of its own:
    what they change meets at its end as a join's branches do, by its own join settings."""
    if node.tag not in ("subProcess", "callActivity", "transaction"):
        return False
    loop = next((c for c in node.element if isinstance(c.tag, str)
                 and c.tag.endswith("}multiInstanceLoopCharacteristics")), None)
    return loop is not None and loop.get("isSequential", "false").strip().lower() != "true"


def _instance_id_of(bid: str, node: Any) -> int | None:
    """N of ``ACTIVITY#N`` when ``bid`` names an instance of ``node``, a parallel multi-instance scope."""
    head, sep, number = bid.rpartition("#")
    if not sep or head != node.id or not number.isdigit() or not _parallel_multi_scope(node):
        return None
    return int(number)


def _incoming(node: Any) -> list[Any]:
    scope = node.getparent()
    return list(_scope_index(scope)[2].get(node.get("id"), ())) if scope is not None else []


def _may_begin_branch(node: Any) -> bool:
    """Whether a branch may be named by ``node``: the target of a flow out of a split (an element
    with several outgoing flows, or a boundary event), a gateway (a join that closes part of a
    split names the branch it merges into), or an event that starts a path of its own."""
    tag = etree.QName(node).localname
    if tag.endswith("Gateway") or tag in ("boundaryEvent", "startEvent"):
        return True
    scope = node.getparent()
    if scope is None:
        return True
    by_id = _scope_index(scope)[0]
    for flow in _incoming(node):
        source = by_id.get(flow.get("sourceRef"))
        if source is None or etree.QName(source).localname == "boundaryEvent" or len(_outgoing(source)) > 1:
            return True
    return False


def _branch_starts(node: Any) -> list[str]:
    """The targets of the flows out of the splits beside ``node`` (in its process or sub-process)."""
    scope = node.getparent()
    if scope is None:
        return []
    flows = list(scope.iterchildren(_bpmn("sequenceFlow")))
    out_count: dict[str, int] = {}
    for f in flows:
        out_count[f.get("sourceRef")] = out_count.get(f.get("sourceRef"), 0) + 1
    return sorted({str(f.get("targetRef")) for f in flows if out_count.get(f.get("sourceRef"), 0) > 1})


def _outgoing(node: Any) -> list[Any]:
    scope = node.getparent()
    return list(_scope_index(scope)[1].get(node.get("id"), ())) if scope is not None else []


def _condition_text(flow: Any, tag: str = "conditionExpression") -> str:
    expr = flow.find(_bpmn(tag))
    return (expr.text or "").strip() if expr is not None else ""


def _written_elsewhere(el: Any, what: str) -> str:
    """Where another engine wrote the script or condition that the element lacks (BPMNEngine's
    exts:cSharpScript, exts:ConditionSet): a clause naming that extension element, else "", to
    put in parentheses."""
    for child in el.iterfind(f"{_bpmn('extensionElements')}/*"):
        name = etree.QName(child)
        if isinstance(child.tag, str) and what in name.localname.lower() \
                and name.namespace not in (SPIFF_NS, "http://camunda.org/schema/zeebe/1.0"):
            return (f"its {what} is written in {child.prefix or name.namespace}:{name.localname}, another engine's "
                    "extension element, which SpiffWorkflow does not read: write it in Python here")
    return ""


def _flow_node_id(el: Any) -> str | None:
    """The id of the task, event or gateway an element (a timer, a loop's condition) belongs to."""
    owner = next((a for a in el.iterancestors() if a.tag in _FLOW_NODES), None)
    return owner.get("id") if owner is not None else None


def _formless_task(task: Any) -> bool:
    """A user (manual) task with no form: the person's answer may set any key."""
    return not any("form" in str(k).lower() or "form" in str(v).lower() or "form" in etree.QName(el).localname.lower()
                   for el in task.iter() if isinstance(el.tag, str) for k, v in [*el.attrib.items(), ("", "")])


# BPMN elements whose name is a name of the data (a label elsewhere: ``_condition_names_set``)
_NAMED_DATA = frozenset({"dataObject", "dataObjectReference", "dataStore", "dataStoreReference", "property",
                         "dataInput", "dataOutput"})

_DECISIONS = frozenset(_bpmn(t) for t in ("exclusiveGateway", "inclusiveGateway", "eventBasedGateway",
                                            "complexGateway"))


def _always_reached(node: Any, process: Any) -> bool:
    """Whether every run of ``process`` reaches ``node``, as far as the drawing tells: from the first start
    event without a trigger of each scope around it, through flows that leave no gateway that decides and
    no activity with a boundary event, to a node that neither loops nor is an event sub-process."""
    current = node
    while current is not process:
        scope = current.getparent()
        if (scope is None or current.find(_bpmn("standardLoopCharacteristics")) is not None
                or current.find(_bpmn("multiInstanceLoopCharacteristics")) is not None
                or scope.get("triggeredByEvent") == "true" or scope.tag == _bpmn("adHocSubProcess")):
            return False
        start = next((s for s in scope.iterchildren(_bpmn("startEvent"))
                      if not any(isinstance(c.tag, str) and c.tag.endswith("EventDefinition") for c in s)), None)
        if start is None:
            return False
        bounded = {b.get("attachedToRef") for b in scope.iterchildren(_bpmn("boundaryEvent"))}
        nodes = {el.get("id"): el for el in scope if isinstance(el.tag, str) and el.tag in _FLOW_NODES}
        seen, todo = set(), [start]
        while todo and current not in todo:
            el = todo.pop()
            if el.get("id") in seen or el.tag in _DECISIONS or el.get("id") in bounded:
                continue
            seen.add(el.get("id"))
            todo.extend(n for n in _successors(el) if n.get("id") in nodes)
        if current not in todo:
            return False
        current = scope
    return True


def _call_cycle(start: str, calls: Mapping[str, list[tuple[Any, str]]]) -> list[tuple[Any, str]] | None:
    """The calls (call activity, called process) that lead from process ``start`` back to it, each made by
    every run of its process, or None."""
    todo: list[tuple[str, list[tuple[Any, str]]]] = [(start, [])]
    seen: set[str] = set()
    while todo:
        pid, chain = todo.pop()
        for call, called in calls.get(pid, []):
            if called == start:
                return [*chain, (call, called)]
            if called not in seen:
                seen.add(called)
                todo.append((called, [*chain, (call, called)]))
    return None


_NO_DATA_STORE = re.compile(r"Data Store with name (.*) has no implementation", re.DOTALL)  # a name may span lines


def _data_store_of(err: BaseException, docs: Sequence[_Doc]) -> tuple[Any, _Doc] | None:
    """The bpmn:dataStore (element, file) SpiffWorkflow found no implementation for, or that has
    no name (its message then names nothing), else None."""
    text = str(err).strip()
    found = _NO_DATA_STORE.match(text)
    unnamed = text.startswith("Data Store name is missing")
    if found is None and not unnamed:
        return None
    for doc in docs:
        for el in doc.root.iter(_bpmn("dataStore")) if doc.root is not None else ():
            # an empty name="" is as good as none: SpiffWorkflow then says "with name  has" (two spaces)
            if (el.get("name") or "").strip() == (found.group(1).strip() if found else ""):
                return el, doc
    return None


def _retrieval_without_message(err: BaseException, docs: Sequence[_Doc]) -> tuple[Any, Any, _Doc] | None:
    """(retrieval expression, correlation property, file) for SpiffWorkflow's "Message identifier is
    missing from correlation property: ID", which names neither the file nor the line."""
    found = re.match(r"Message identifier is missing from correlation property: (\S+)", str(err).strip())
    if found is None:
        return None
    for doc in docs:
        for prop in doc.root.iter(_bpmn("correlationProperty")) if doc.root is not None else ():
            if prop.get("id") != found.group(1).rstrip("."):
                continue
            for expr in prop.iter(_bpmn("correlationPropertyRetrievalExpression")):
                if not (expr.get("messageRef") or "").strip():
                    return expr, prop, doc
    return None


_UNRESOLVED_ASSOCIATION = re.compile(r"Cannot resolve (dataInputAssociation|dataOutputAssociation)")


def _unresolved_association(err: BaseException, node: Any, docs: Sequence[_Doc]) -> tuple[Any, str, str] | None:
    """(association element, field, what is wrong and what to do) for SpiffWorkflow's "Cannot resolve
    dataInputAssociation <Element ...>", which names neither the data nor why: a modeler's data store
    drawn as a source or target (bpmn.io and Camunda Modeler draw them with no bpmn:dataStore), or an id
    that is no data object reference."""
    found = _UNRESOLVED_ASSOCIATION.match(str(err).strip())
    if found is None or node is None or getattr(node, "element", None) is None:
        return None
    field = found.group(1)
    ends = {"dataInputAssociation": ("sourceRef", "reads"), "dataOutputAssociation": ("targetRef", "writes")}
    end, verb = ends[field]
    elements = {el.get("id"): el for doc in docs if doc.root is not None for el in doc.root.iter() if el.get("id")}
    for association in node.element.iter(_bpmn(field)):
        for ref in association.iter(_bpmn(end)):
            target = elements.get((ref.text or "").strip())
            if target is not None and target.tag == _bpmn("dataStoreReference"):
                name = f" {target.get('name')!r}" if target.get("name") else ""
                return association, field, (
                    f"{verb} the data store{name} (bpmn:dataStoreReference {target.get('id')!r}) through a "
                    f"{field}: SpiffWorkflow reads and writes a data store only through a class registered for it, "
                    "and layerflow registers none; delete the association (the data store may stay in the diagram "
                    "as documentation), or keep the value in a bpmn:dataObject or a variable the tasks write")
            if target is None or target.tag != _bpmn("dataObjectReference"):
                return association, field, (
                    f"{verb} {(ref.text or '').strip()!r} through a {field}, and that is no bpmn:dataObjectReference "
                    f"of the process; point its {end} at a data object reference, or delete the association")
    return None



# Which event definitions BPMN (2.0.2, table 10.93) allows on each kind of event, and what each kind does.
_EVENT_KINDS_ALLOWED = {
    "startEvent": frozenset({"message", "timer", "conditional", "signal"}),
    "intermediateCatchEvent": frozenset({"message", "timer", "conditional", "signal"}),
    "intermediateThrowEvent": frozenset({"message", "escalation", "signal"}),
    "endEvent": frozenset({"message", "error", "escalation", "cancel", "signal", "terminate"}),
    "boundaryEvent": frozenset({"message", "timer", "escalation", "conditional", "error", "cancel", "signal"}),
}
_EVENT_KIND_NAMES = {
    "startEvent": ("start event", "starts on a message, signal, timer or condition, or, in an event sub-process, "
                   "on an error or escalation too"),
    "intermediateCatchEvent": ("intermediate catch event", "waits for a message, signal, timer, condition or link"),
    "intermediateThrowEvent": ("intermediate throw event", "throws a message, signal, escalation, compensation or "
                               "link"),
    "endEvent": ("end event", "ends with a message, signal, error, escalation, cancel, compensation or terminate"),
    "boundaryEvent": ("boundary event", "catches a message, signal, timer, condition, error, escalation, cancel "
                      "or compensation"),
}


def _misplaced_todo(kind: str, tag: str) -> str:
    """What to draw for an event definition in a place BPMN does not allow it (``_check_event_definitions``)."""
    if kind in ("timer", "conditional"):
        return "to wait, draw an intermediate catch event with it (or a boundary event on the activity it times)"
    if kind in ("error", "escalation", "cancel") and tag in ("intermediateCatchEvent", "startEvent"):
        if kind == "cancel":
            return "to catch a cancel, attach a cancel boundary event to the transaction"
        sub = ("put the start event in an event sub-process (triggeredByEvent=\"true\")" if tag == "startEvent" else
               f"draw an event sub-process with an {kind} start event")
        return f"to catch an {kind}, attach an {kind} boundary event to the activity that throws it, or {sub}"
    return "to end there, draw an end event with it" + (" inside the transaction" if kind == "cancel" else "")


def _off_the_flow(el: Any) -> bool:
    """A node that sequence flows do not reach or leave: a compensation handler, the content of an
    ad-hoc sub-process, an event sub-process and its start, a link event (a throw goes on at its
    catch, and a catch is reached from its throws: ``_check_link``)."""
    parent = el.getparent()
    return (el.get("isForCompensation") == "true" or el.get("triggeredByEvent") == "true"
            or el.find(_bpmn("linkEventDefinition")) is not None
            or (parent is not None and (parent.tag == _bpmn("adHocSubProcess")
                                        or parent.get("triggeredByEvent") == "true")))


_CONDITIONAL_SOURCES = frozenset({"exclusiveGateway", "inclusiveGateway"})
_SCOPES = tuple(_bpmn(t) for t in ("subProcess", "transaction"))
_PATH_NODES = frozenset({
    "task", "userTask", "manualTask", "scriptTask", "serviceTask", "sendTask", "receiveTask", "businessRuleTask",
    "callActivity", "subProcess", "transaction", "intermediateCatchEvent", "intermediateThrowEvent",
    "exclusiveGateway", "parallelGateway", "inclusiveGateway", "eventBasedGateway"})
_TASK_NAMES = {"scriptTask": "script task", "serviceTask": "service task"}
_ISO_8601 = re.compile(r"R\d*/.*|P(?=[\dT])(\d+Y)?(\d+M)?(\d+W)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?"
                       r"|\d{4}-\d{2}-\d{2}([T ][\d:.]+)?(Z|[+-]\d{2}:?\d{2})?", re.I)
_DIALECTS = {"JUEL": "Camunda 7's ${...}", "FEEL": "Camunda 8's =..."}


def _dialect_said(source: str, dialect: str) -> str:
    """Which engine's notation an expression is in, as its delimiters say: JUEL's ``#{...}`` is the
    deferred form of ``${...}`` (Camunda 7, Activiti and Flowable evaluate both alike)."""
    if dialect == "JUEL" and source.lstrip().startswith("#{"):
        return "JUEL's deferred #{...}, as Camunda 7, Activiti and Flowable write it, evaluated as ${...} is"
    return _DIALECTS[dialect]
# jBPM's duration short form: 1d2h30m10s500ms, each part optional
_JBPM_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?", re.I)
# Quartz / Unix cron: five to seven fields of numbers, * / , - ? L W #, or three-letter month and day names
_CRON_FIELD = r"(?:[\d*?/,LW#-]+|[A-Za-z]{3}(?:[-,][A-Za-z]{3})*)"
_CRON = re.compile(rf"(?:{_CRON_FIELD}\s+){{4,6}}{_CRON_FIELD}")
_CRON_UNITS = (("S", "second"), ("M", "minute"), ("H", "hour"))


def _cron_every(text: str) -> tuple[int, str, str] | None:
    """(n, ISO unit, word) when cron ``text`` fires every n seconds, minutes or hours (Quartz's six or
    seven fields, "0 0/5 * * * ?", or Unix's five, "*/5 * * * *"); None for any other schedule."""
    fields = text.split()
    if len(fields) == 5:
        fields = ["0", *fields]  # Unix cron has no seconds: it fires at second 0
    if len(fields) not in (6, 7):
        return None
    every = {"*", "?", "*/1", "0/1", "1/1"}
    if any(f not in every for f in fields[3:]):
        return None  # a day, month, weekday or year is named: a calendar schedule
    for index, (unit, word) in enumerate(_CRON_UNITS):
        finer, field, coarser = fields[:index], fields[index], fields[index + 1:3]
        if not all(f.isdigit() for f in finer) or any(f not in every for f in coarser):
            continue
        step = re.fullmatch(r"(?:\*|0)/(\d+)", field)
        n = int(step.group(1)) if step else 1 if field in every else 0
        if n > 0:
            return n, unit, word
    return None


def _cron_instead(text: str) -> str:
    """What to write in place of cron ``text``: the ISO 8601 cycle it is, when it is a plain period."""
    every = _cron_every(text)
    if every is None:
        return ("write the cycle as an ISO 8601 repeating interval in quotes, e.g. \"R/PT1H\" (each hour from "
                "when the timer starts) or \"R/2026-01-05T09:00:00/P1D\" (each day at 9:00)")
    n, unit, word = every
    return (f"it fires every {n} {word}{'s' if n > 1 else ''}: write \"R/PT{n}{unit}\" (with the quotes), an "
            f"ISO 8601 cycle counted from when the timer starts, not from the clock's whole {word}s")
# Camunda (7 and 8), Operaton, Activiti and Flowable: their modelers write execution settings in these
_JBPM_NS = "http://www.jboss.org/drools"
_KCONTEXT_SET = re.compile(r"kcontext\s*\.\s*setVariable\(\s*[\"']([A-Za-z_]\w*)[\"']")


def _shorten(text: str, limit: int = 80) -> str:
    """``text`` on one line, cut to ``limit`` characters (with "..." where cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


_BPMNOS_NS = "https://bpmnos.telematique.eu"
_ENGINE_NAMESPACES = {"http://camunda.org/schema/1.0/bpmn": "camunda", "http://camunda.org/schema/zeebe/1.0": "zeebe",
                      "http://operaton.org/schema/1.0/bpmn": "operaton",
                      "http://activiti.org/bpmn": "activiti", "http://flowable.org/bpmn": "flowable",
                      # BPMN-OS (optimisation models): a task's status operators compute as it runs
                      _BPMNOS_NS: "bpmnos"}
_JUEL_LITERALS = frozenset({"true", "false", "null"})
_JUEL_BEAN = re.compile(r"[$#]\{\s*([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*)\s*\(.*\))?\s*\}", re.S)
_RUN_BY_HANDLER = "run the step with a handler (handler: file.py:function in its config) or an llm: block"
_WORK_BEFORE = ("do its work in a bpmn:serviceTask drawn before it (a handler or an llm: block there), or make it a "
                "bpmn:serviceTask")
# what runs in place of a handler on elements that are not tasks doing the work themselves
_NOT_WORKED = {
    "sendTask": ("sends its message (spiffworkflow:messagePayload, or nothing)", _WORK_BEFORE),
    "receiveTask": ("waits for its message", _WORK_BEFORE.replace("before it", "after it")),
    "callActivity": ("runs the process it calls", "give the handler to a task of the called process"),
    "subProcess": ("runs the steps drawn inside it", "give the handler to a task inside it"),
    "transaction": ("runs the steps drawn inside it", "give the handler to a task inside it"),
}
_MAP_IN_CODE = "set the variables in a script, a handler or an ioSpecification"
# what a script of another scriptFormat is, said where its file is named
_SCRIPT_LANGUAGES = {"xslt": "an XSLT stylesheet", "xquery": "an XQuery", "javascript": "JavaScript",
                     "js": "JavaScript", "groovy": "Groovy", "juel": "a JUEL expression", "ruby": "Ruby"}


def _event_payload_todo(el: Any, eid: str, tag: str) -> str | None:
    """What Flowable's (Activiti's, Camunda 7's) in/out mappings on a signal or message event do and
    what to write instead: a thrower's ``out`` builds the payload (SpiffWorkflow's payload expression);
    a catcher's ``in`` renames the payload's keys (a script after the event)."""
    definition = next((d for kind in ("signalEventDefinition", "messageEventDefinition")
                       for d in el.iterfind(_bpmn(kind))), None)
    if definition is None:
        return None
    pairs = [(name, m.get("source"), m.get("target")) for ext in el.iterfind(_bpmn("extensionElements")) for m in ext
             if isinstance(m.tag, str) for name in [_foreign_name(m.tag)]
             if name and name.endswith((":in", ":out")) and m.get("source") and m.get("target")]
    what = "signal" if definition.tag == _bpmn("signalEventDefinition") else "message"
    outs = [(s, t) for name, s, t in pairs if name.endswith(":out")]
    ins = [(s, t) for name, s, t in pairs if name.endswith(":in")]
    if outs and tag in ("intermediateThrowEvent", "endEvent"):
        setting = "payloadExpression" if what == "signal" else "messagePayload"
        where = (f"in the extensionElements of bpmn:signal {definition.get('signalRef')!r}" if what == "signal"
                 else "in the extensionElements of its bpmn:messageEventDefinition")
        listed = ", ".join(f"{s!r} as {t!r}" for s, t in outs)
        built = "{" + ", ".join(f'"{t}": {s}' for s, t in outs) + "}"
        return (f"{pairs[0][0].partition(':')[0]}:out puts {listed} into the {what}'s payload: write "
                f"<spiffworkflow:{setting}>{built}</spiffworkflow:{setting}> {where}, where SpiffWorkflow reads it")
    if ins and tag in ("startEvent", "intermediateCatchEvent", "boundaryEvent"):
        listed = ", ".join(f"{s!r} to {t!r}" for s, t in ins)
        script = "\n".join(f"{t} = {s}" for s, t in ins)
        return (f"{pairs[0][0].partition(':')[0]}:in copies the payload's {listed}: the payload's keys land in the "
                f"context as they are named (sent from outside; thrown in the instance, under the {what}'s "
                f"variable); to have them under the new names, copy them in a bpmn:scriptTask after {eid!r}: "
                f"{script!r}")
    return None
# activities with a pre- and postScript in SpiffWorkflow: their input/output mappings run there
_MAPPED_TAGS = frozenset({"task", "userTask", "manualTask", "scriptTask", "serviceTask", "sendTask", "receiveTask",
                          "businessRuleTask", "callActivity", "subProcess", "transaction"})
# settings that decide what a step does (what to do instead); forms, assignees, history and the
# like change nothing here and are not reported
_FOREIGN_SETTINGS = {
    "class": _RUN_BY_HANDLER, "delegateExpression": _RUN_BY_HANDLER, "expression": _RUN_BY_HANDLER,
    "type": _RUN_BY_HANDLER, "topic": _RUN_BY_HANDLER, "taskDefinition": _RUN_BY_HANDLER, "connector": _RUN_BY_HANDLER,
    "resultVariable": "assign the variable in the script itself (total = a + b)",
    "script": "write the script in Python in the task's bpmn:script",
    "calledDecision": "name the decision with the camunda:decisionRef attribute or <spiffworkflow:calledDecisionId>",
    "collection": "give the loop a bpmn:loopDataInputRef and a bpmn:inputDataItem",
    "elementVariable": "give the loop a bpmn:loopDataInputRef and a bpmn:inputDataItem",
    "loopCharacteristics": "give the loop a bpmn:loopDataInputRef and a bpmn:inputDataItem",
    "inputOutput": _MAP_IN_CODE, "ioMapping": _MAP_IN_CODE, "in": _MAP_IN_CODE, "out": _MAP_IN_CODE,
    "executionListener": "do the listener's work in a task of the process",
    "taskListener": "do the listener's work in a task of the process",
    # Camunda 8 holds its listeners in a list element (zeebe:taskListeners, zeebe:executionListeners)
    "executionListeners": "do the listener's work in a task of the process",
    "taskListeners": "do the listener's work in a task of the process",
    "calledElement": "name the called process in the bpmn:callActivity's calledElement attribute",
    # a script task's script kept in a file of the deployment (camunda:resource="deployment://calc.py")
    "resource": "copy the Python of the file it names into the task's bpmn:script",
    # a start event's variable that the engine sets to the id of the user who started the instance
    "initiator": "give that variable in the start data (--data), as no user starts an instance here",
    # BPMN-OS's attributes, restrictions and the operators that change them as the task runs
    "status": "write what its operators compute in Python, in a script task drawn before or after it",
}


def _message_event_subprocesses(process: Any) -> Iterator[tuple[Any, Any, str]]:
    """(event sub-process, start event, "message" | "signal") of the event sub-processes directly in
    ``process`` (an lxml bpmn:process) that a message or signal starts."""
    for sub in process.iterchildren(_bpmn("subProcess")):
        if sub.get("triggeredByEvent") != "true":
            continue
        for start in sub.iterchildren(_bpmn("startEvent")):
            kinds = [k for k in ("message", "signal") if start.find(_bpmn(f"{k}EventDefinition")) is not None]
            if kinds:
                yield sub, start, kinds[0]


def _foreign_name_of_type(el: Any) -> str:
    """``flowable:type`` (or ``activiti:type``, ...): the name of an element's engine ``type`` attribute."""
    return next((q for q in map(_foreign_name, el.attrib) if q and q.endswith(":type")), "type")


def _identifier_for(label: str) -> str:
    """A variable name for a label: ``Check Result`` gives ``check_result``."""
    words = re.findall(r"[^\W_]+", label.lower())
    name = "_".join(words) or "result"
    return name if name.isidentifier() else f"v_{name}"


def _engine_dmn_task(el: Any) -> str | None:
    """The decision a Flowable / Activiti DMN task runs (a service task with type="dmn" and a
    decisionTableReferenceKey field, given as a string child or a stringValue / expression
    attribute): its key, "" when it names none; None for any other element."""
    if etree.QName(el).localname != "serviceTask" or not any(
            q and q.endswith(":type") and (v or "").strip().lower() == "dmn"
            for q, v in ((_foreign_name(k), v) for k, v in el.attrib.items())):
        return None
    for ext in el.iterfind(_bpmn("extensionElements")):
        for given in ext:
            if not isinstance(given.tag, str) or etree.QName(given).localname != "field":
                continue
            if given.get("name") != "decisionTableReferenceKey":
                continue
            value = given.get("stringValue") or given.get("expression") or "".join(
                (child.text or "") for child in given if isinstance(child.tag, str)
                and etree.QName(child).localname in ("string", "expression"))
            return value.strip()
    return ""


def _as_written(el: Any) -> Callable[[str], str]:
    """``activiti:connector`` as ``el``'s file writes it, when the file binds another prefix to that
    engine's namespace (Camunda 7.0 saved ``camunda:`` bound to Activiti's): the name searched for
    in the file is the one it holds."""
    engines = {prefix: ns for ns, prefix in _ENGINE_NAMESPACES.items()}

    def said(name: str) -> str:
        prefix, _, local = name.partition(":")
        ns = engines.get(prefix)
        written = next((k for k, v in el.nsmap.items() if v == ns and k), prefix)
        if written == prefix:
            return name
        owner = prefix.capitalize() if prefix != "bpmnos" else "BPMN-OS"
        return (f"{name} (written {written}:{local} in this file, whose prefix {written} names {owner}'s "
                f"namespace {ns})")
    return said


def _foreign_name(tag: str) -> str | None:
    """``camunda:class`` for an attribute or element name in another engine's namespace that
    ``_FOREIGN_SETTINGS`` lists, else None."""
    qn = etree.QName(tag)
    prefix = _ENGINE_NAMESPACES.get(qn.namespace or "")
    return f"{prefix}:{qn.localname}" if prefix and qn.localname in _FOREIGN_SETTINGS else None


_JUEL_OPERATORS = ((r"&&", " and "), (r"\|\|", " or "), (r"!(?!=)", " not "), (r"\beq\b", "=="), (r"\bne\b", "!="),
                   (r"\blt\b", "<"), (r"\bgt\b", ">"), (r"\ble\b", "<="), (r"\bge\b", ">="),
                   (r"\bnull\b", "None"), (r"\btrue\b", "True"), (r"\bfalse\b", "False"))


def _comparison_instead(source: str) -> str | None:
    """``x = 1`` written as a condition: the comparison ``x == 1`` when that is what it reads as."""
    try:
        tree = ast.parse(source, mode="exec")
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign) or len(tree.body[0].targets) != 1:
        return None
    compared = re.sub(r"(?<![<>!=])=(?!=)", "==", source, count=1)
    # the languages that compare with one '=' (NCalc, SQL-like) spell their literals lowercase
    compared = re.sub(r"('[^']*'|\"[^\"]*\")|\b(true|false|null)\b",
                      lambda m: m.group(1) or _PYTHON_LITERALS[m.group(2)], compared)
    try:
        ast.parse(compared, mode="eval")
    except SyntaxError:
        return None
    return compared


#: the variables Camunda sets inside a multi-instance activity, which SpiffWorkflow does not
_CAMUNDA_LOOP_NAMES = frozenset({"nrOfInstances", "nrOfActiveInstances", "nrOfCompletedInstances", "loopCounter"})

#: FEEL's and JUEL's functions a condition may call by habit, and their Python
# SpiffArena's backend scripts (spiffworkflow_backend/scripts): callable in its process models only
_SPIFFARENA_SCRIPTS = frozenset({
    "add_permission", "delete_process_instances_with_criteria", "get_all_permissions", "get_current_task_info",
    "get_current_user", "get_data_sizes", "get_encoded_file_data", "get_env", "get_frontend_url",
    "get_group_members", "get_last_user_completing_task", "get_localtime", "get_process_initiator_user",
    "get_secret", "get_task_data_value", "get_toplevel_process_info", "get_url_for_task_with_bpmn_identifier",
    "markdown_file_download_link", "refresh_permissions", "set_user_properties",
})

_FOREIGN_FUNCTIONS = {
    "count": "len(...)", "size": "len(...)", "length": "len(...)", "contains": "write 'PART in TEXT'",
    "string": "str(...)", "number": "float(...) or int(...)", "lower": "write TEXT.lower()",
    "upper": "write TEXT.upper()", "empty": "write 'not VALUE'", "is_defined": "write 'VALUE is not None'",
    "now": "compare ISO 8601 text, or set the time in a task", "today": "compare ISO 8601 text, or set it in a task",
}


#: how JavaScript engines (bpmn-engine, bpmn-server) reach a process variable: through their
#: environment (``environment.variables.x``, ``environment.output.x``, ``this.environment...``),
#: the old ``this.context.x``, and ``variables.x`` in their ``${...}`` expressions
_JAVASCRIPT_READ = re.compile(r"(?<![\w.])(?:this\.)?(?:environment\.(?:variables|output)|context|variables)"
                              r"\.([A-Za-z_]\w*)")


def _foreign_reads_instead(source: str) -> str:
    """Another engine's ways to read a variable as the name they read: Camunda's
    ``execution.getVariable("x")``, Imixs's ``workitem.getItemValueString("x")``, a JavaScript
    engine's ``environment.variables.x``."""
    source = re.sub(r"\b(?:execution|task)\.getVariable(?:Local)?\(\s*(['\"])([A-Za-z_]\w*)\1\s*\)", r"\2", source)
    # Imixs-Workflow's item of the document (workitem.getItemValueDouble('_budget'))
    source = re.sub(r"\bworkitem\.getItemValue\w*\(\s*(['\"])([A-Za-z_]\w*)\1\s*\)", r"\2", source)
    return _JAVASCRIPT_READ.sub(r"\1", source)


#: JavaScript's length of a list or text, ``items.length``: Python's ``len(items)``
_JAVASCRIPT_LENGTH = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\.length\b(?!\s*\()")


def _javascript_expression_instead(source: str) -> str:
    """A JavaScript expression's reads and lengths as Python's: ``environment.variables.items.length``
    is ``len(items)``; a statement's closing ``;`` is dropped."""
    return _JAVASCRIPT_LENGTH.sub(r"len(\1)", _foreign_reads_instead(source)).strip().rstrip(";").strip()


#: the bases of a JavaScript engine's runtime that a script or condition can only mean as such
_JAVASCRIPT_SERVICES = ("variables", "output", "services")


def _javascript_api(tree: ast.AST) -> list[str]:
    """What a JavaScript engine's script or condition uses of that engine's runtime, which parses as
    Python and is not here: ``this.…`` (Python has no ``this``), ``environment.variables`` /
    ``.output`` / ``.services`` (bpmn-engine's environment), ``console.…`` and ``next()`` (the
    callback bpmn-engine's scripts hand control back with; Python's ``next`` needs an argument).
    A name the script binds itself (``console = ...``) is its own. ``x.length`` (JavaScript's
    length of a list or text) is reported too: Python writes ``len(x)``."""
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    chains: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next" \
                and not node.args and not node.keywords and "next" not in bound:
            chains.add("next()")
        if not isinstance(node, ast.Attribute):
            continue
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            base = base.value
        if not isinstance(base, ast.Name) or base.id in bound:
            continue
        chain = ast.unparse(node)
        if base.id in ("this", "console") or (
                base.id == "environment" and chain.split(".")[1] in _JAVASCRIPT_SERVICES):
            chains.add(chain)
        elif node.attr == "length":
            chains.add(chain)  # JavaScript's and Java's length: no JSON value has the attribute
    # the longest chain of each read: this.environment.variables.x, not also this.environment
    return sorted(c for c in chains if not any(o.startswith(c + ".") for o in chains))


def _language_not_read(el: Any, what: str) -> str:
    """What a message adds when the element declares a ``language``: layerflow reads Python only."""
    language = el.get("language") if el is not None else None
    return f" (its language={language!r} is not read: {what}s are Python)" if language else ""


def _rewrite_todo(rewrite: str, still_foreign: Callable[[ast.AST], list[str]]) -> str:
    """What to do about a foreign expression: write its Python ``rewrite`` when that holds
    nothing ``still_foreign`` finds, else read each variable by its name."""
    instead = " ".join(rewrite.split())
    try:
        if not still_foreign(ast.parse(instead, mode="eval")):
            return f"write {instead!r}"
    except SyntaxError:
        pass
    return "read each variable by its name"


#: attributes a JSON value has (a number's parts): reading them is no path into an object
_JSON_ATTRIBUTES = frozenset({"real", "imag", "numerator", "denominator"})


def _attribute_paths(tree: ast.AST) -> list[ast.Attribute]:
    """The outermost ``a.b.c`` reads over a context key that are no method call (``a.b.lower()``
    reads ``a.b``): no JSON value has such an attribute. Python's own names (``str.upper``) are
    left alone."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    inner: set[int] = set()
    found: list[ast.Attribute] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue
        if id(node) in called:
            # a method call: its object may still be a path (order.customer in order.customer.lower())
            continue
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            inner.add(id(base.value))
            base = base.value
        if isinstance(base, ast.Name) and not hasattr(builtins, base.id) and node.attr not in _JSON_ATTRIBUTES \
                and base.id not in ("this", "console", "environment") and node.attr != "length":
            found.append(node)  # (a JavaScript engine's runtime and length: ``_javascript_api``)
    return found


# Modules of Python's that a script or payload written for SpiffArena (or SpiffWorkflow's tutorial,
# whose script engines put them in every script's globals) calls without importing them
_STDLIB_MODULES = frozenset({"datetime", "time", "math", "json", "random", "re", "uuid", "decimal", "calendar",
                             "os", "sys", "string", "statistics", "itertools", "collections", "functools"})


def _module_calls(tree: ast.AST, bound: set[str]) -> list[str]:
    """Calls through a module nothing binds: ``datetime.datetime.utcnow()`` as written, in order."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            root: ast.expr = node.func
            first = node.func.attr
            while isinstance(root, ast.Attribute):
                first, root = root.attr, root.value
            # a context value named like a module (a dict called "calendar") has other attributes than
            # the module: only a name the module has is counted as the module's
            if (isinstance(root, ast.Name) and root.id in _STDLIB_MODULES and root.id not in bound
                    and hasattr(importlib.import_module(root.id), first)):
                found.append(ast.unparse(node.func) + "()")
    return sorted(set(found), key=found.index)


def _module_names(calls: list[str]) -> str:
    names = list(dict.fromkeys(call.split(".", 1)[0] for call in calls))
    return ", ".join(names)


def _imports(calls: list[str]) -> str:
    return " and ".join(f"'import {name}'" for name in _module_names(calls).split(", "))


def _attribute_reads(tree: ast.AST) -> list[str]:
    """``_attribute_paths`` as the text they read, in the order written."""
    return sorted({ast.unparse(n) for n in _attribute_paths(tree)},
                  key=lambda text: ast.unparse(tree).find(text))


def _keys_instead(tree: ast.AST) -> str:
    """The expression with its attribute paths read by key: ``order.shipping.express`` is
    ``order['shipping']['express']``."""
    copy = ast.parse(ast.unparse(tree), mode="eval")
    targets = {id(n) for n in _attribute_paths(copy)}

    def by_key(node: ast.expr) -> ast.expr:
        if isinstance(node, ast.Attribute):
            return ast.Subscript(value=by_key(node.value), slice=ast.Constant(node.attr), ctx=ast.Load())
        return node

    class _ByKey(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
            if id(node) in targets:
                return by_key(node)
            self.generic_visit(node)
            return node

    return ast.unparse(_ByKey().visit(copy))


def _javascript_script_instead(source: str) -> str | None:
    """A JavaScript engine's script as Python, when a plain rewrite gives one with nothing of the
    engine left: ``next();`` lines dropped, ``console.log(`` printed, variables read and set by
    their names, ``x++`` counted, JavaScript's literals spelt as Python's; else None."""
    lines = []
    for line in source.strip().splitlines():
        line = line.strip().rstrip(";").strip()
        if line in ("next()", "next(null)"):
            continue
        line = re.sub(r"\bconsole\.(?:log|info|warn|error|debug)\(", "print(", line)
        line = _JAVASCRIPT_LENGTH.sub(r"len(\1)", _foreign_reads_instead(line))
        line = re.sub(r"^([A-Za-z_]\w*)\s*(\+\+|--)$", lambda m: f"{m.group(1)} {m.group(2)[0]}= 1", line)
        line = re.sub(r"\b(true|false|null|undefined)\b", lambda m: _PYTHON_LITERALS[m.group(1)], line)
        lines.append(line)
    text = "\n".join(lines) or "pass"
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    return None if _javascript_api(tree) or _camunda_api_calls(tree) or _java_api_calls(tree) else text


def _javascript_undeclared(source: str) -> tuple[ast.AST, str] | None:
    """A JavaScript script without its ``var``/``let``/``const`` and line-end semicolons, parsed, when
    that much makes it parse as Python (its calls can then be named); None otherwise."""
    if not re.search(r"^\s*(?:var|let|const)\s", source, re.M):
        return None
    lines = [re.sub(r"^(\s*)(?:var|let|const)\s+", r"\1", line).rstrip().rstrip(";")
             for line in source.strip().splitlines()]
    text = "\n".join(lines)
    try:
        return ast.parse(text, mode="exec"), text
    except SyntaxError:
        return None


_GROOVY_PRINTLN = re.compile(r"println\s*\(?\s*(['\"])(.*?)\1\s*\)?\s*;?")


def _groovy_print_instead(source: str) -> str | None:
    """A script of Groovy ``println 'text'`` lines as Python ``print("text")`` lines; None when any
    line is something else."""
    lines = [line.strip() for line in source.strip().splitlines() if line.strip()]
    found = [_GROOVY_PRINTLN.fullmatch(line) for line in lines]
    # (a double-quoted Groovy string interpolates ${...}: that is no plain text to print)
    if not lines or not all(m is not None and not (m.group(1) == '"' and "$" in m.group(2)) for m in found):
        return None
    return "\n".join(f"print({json.dumps(m.group(2))})" for m in found if m is not None)


def _bare_juel_name(value: str) -> str | None:
    """``items`` for ``${items}`` (or ``#{items}``): an expression that only names a variable."""
    found = re.fullmatch(r"[$#]\{\s*([A-Za-z_]\w*)\s*\}", value.strip())
    return found.group(1) if found else None


def _loop_said_again(loop: Any) -> set[str]:
    """The other engine's multi-instance attributes (``collection``, ``elementVariable``) that the
    standard ``loopDataInputRef`` and ``inputDataItem`` of the same loop say again."""
    ref = (loop.findtext(_bpmn("loopDataInputRef")) or "").strip()
    item = loop.find(_bpmn("inputDataItem"))
    names = {(_foreign_name(k) or "").partition(":")[2]: v.strip() for k, v in loop.attrib.items()}
    said = set()
    if ref and ref in (names.get("collection"), _bare_juel_name(names.get("collection", ""))):
        said.add("collection")
    if item is not None and names.get("elementVariable") in (item.get("name"), item.get("id")):
        said.add("elementVariable")
    return said


def _juel_set_variables(value: str) -> tuple[str, dict[str, str]] | None:
    """``${execution.setVariable('x', 5)}`` as its Python (``x = 5``) and the values it sets
    (``{"x": "5"}``, Python source); None for any other expression."""
    inner = value.strip()
    if inner[:2] not in ("${", "#{") or not inner.endswith("}"):
        return None
    script = _camunda_script_instead(inner[2:-1].strip())
    if not script or "execution" in script:
        return None
    returns = {}
    for line in script.splitlines():
        name, eq, python = line.partition(" = ")
        if not eq or not name.isidentifier():
            return None
        returns[name] = python
    return script, returns


def _camunda_script_instead(source: str) -> str | None:
    """A script of Camunda's ``execution.setVariable("x", value)`` lines as Python assignments,
    when every call of Camunda's API in it is one of those or a variable read; else None."""
    lines = []
    for line in source.strip().splitlines():
        line = _foreign_reads_instead(line.strip().rstrip(";").strip())
        setter = re.fullmatch(r"(?:execution|task)\.setVariable(?:Local)?\(\s*(['\"])([A-Za-z_]\w*)\1\s*,\s*(.+)\)",
                              line)
        value = setter.group(3).strip() if setter else ""
        value = {"true": "True", "false": "False", "null": "None"}.get(value, value)
        lines.append(f"{setter.group(2)} = {value}" if setter else line)
    text = "\n".join(lines)
    try:
        return None if _camunda_api_calls(ast.parse(text)) else text
    except SyntaxError:
        return None


def _camunda_api_calls(tree: ast.AST) -> list[str]:
    """The calls of Camunda's process API in an expression (``execution.getVariable``,
    ``task.hasVariable``): no context value has them (values are JSON)."""
    return sorted({ast.unparse(n.func) for n in ast.walk(tree)
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and isinstance(n.func.value, ast.Name)
                   and (n.func.value.id == "execution" or n.func.value.id in ("task", "delegateTask")
                        and n.func.attr.startswith(("getVariable", "hasVariable", "setVariable")))})


def _imixs_api_calls(tree: ast.AST) -> list[str]:
    """The calls of Imixs-Workflow's document API in an expression (``workitem.getItemValueDouble('x')``,
    ``workitem.hasItem('x')``): no context value has them (values are JSON)."""
    return sorted({ast.unparse(n.func) for n in ast.walk(tree)
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and isinstance(n.func.value, ast.Name) and n.func.value.id == "workitem"
                   and n.func.attr.startswith(("getItemValue", "hasItem", "isItemValue"))})


#: FEEL's temporal literals (``date and time("2021-12-23T00:00")``), which are ISO 8601 text here
_FEEL_TEMPORAL = re.compile(r"(?<![\w.])(date and time|date|time|duration)\s*\(\s*(\"[^\"]*\"|'[^']*')\s*\)")

#: FEEL's string functions, as Python writes them (a name or dotted path as their argument)
_FEEL_STRING_FUNCTIONS = (
    (r"(?<![\w.])upper case\(\s*([A-Za-z_][\w.]*)\s*\)", r"\1.upper()"),
    (r"(?<![\w.])lower case\(\s*([A-Za-z_][\w.]*)\s*\)", r"\1.lower()"),
    (r"(?<![\w.])string length\(\s*([A-Za-z_][\w.]*)\s*\)", r"len(\1)"),
    (r"(?<![\w.])starts with\(\s*([A-Za-z_][\w.]*)\s*,\s*(\"[^\"]*\"|'[^']*')\s*\)", r"\1.startswith(\2)"),
    (r"(?<![\w.])ends with\(\s*([A-Za-z_][\w.]*)\s*,\s*(\"[^\"]*\"|'[^']*')\s*\)", r"\1.endswith(\2)"),
)

# FEEL's built-in functions whose names are one word: they parse as Python calls of names that
# nothing defines where SpiffWorkflow evaluates a table. Each with its Python (None: none here).
_FEEL_FUNCTIONS: dict[str, str | None] = {
    "string": "str", "number": "float", "count": "len", "decimal": "round", "floor": None, "ceiling": None,
    "substring": None, "contains": None, "matches": None, "replace": None, "split": None, "append": None,
    "concatenate": None, "mean": None, "median": None, "product": None, "flatten": None, "now": None,
    "today": None, "duration": None, "date": None, "time": None, "modulo": None, "odd": None, "even": None,
}
_FEEL_HINTS = {
    "floor": "int(x // 1)", "ceiling": "-int(-x // 1)", "substring": "s[start - 1:]", "contains": "'sub' in s",
    "append": "items + [x]", "concatenate": "a + b", "mean": "sum(xs) / len(xs)", "modulo": "a % b",
    "odd": "x % 2 == 1", "even": "x % 2 == 0", "replace": "s.replace(old, new)", "split": "s.split(sep)",
}


def _feel_calls(text: str) -> str | None:
    """What to write for an entry or input expression that calls FEEL's one-word functions
    (``string(amount) + " EUR"``, ``floor(x)``, ``count(items)``), which parse as Python calls of
    names no context holds; None when it calls none."""
    try:
        tree = ast.parse(python_source(text) or text, mode="eval")
    except (SyntaxError, ValueError):
        return None
    names = sorted({n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                    and n.func.id in _FEEL_FUNCTIONS})
    if not names:
        return None
    said = ", ".join(f"{name}()" for name in names)
    instead = text
    for name in names:
        python = _FEEL_FUNCTIONS[name]
        if python is not None:
            instead = re.sub(rf"(?<![\w.]){name}\s*\(", f"{python}(", instead)
    if all(_FEEL_FUNCTIONS[name] is not None for name in names):
        return f"{said} {'is' if len(names) == 1 else 'are'} FEEL's, no function here: write it as {instead!r}"
    hints = [f"{name}(x): {_FEEL_HINTS[name]}" for name in names if name in _FEEL_HINTS]
    return (f"{said} {'is' if len(names) == 1 else 'are'} FEEL's, no function here: write it as a Python "
            f"expression{' (' + '; '.join(hints) + ')' if hints else ''}")


_PYTHON_LITERALS = {"true": "True", "false": "False", "null": "None", "none": "None", "nil": "None",
                    "undefined": "None"}


def _feel_literals(text: str, kind: str) -> list[str]:
    """The names of another language's literals (FEEL's ``true``, ``null``) a DMN entry reads,
    which SpiffWorkflow's Python DMN engine looks up as variables."""
    for source in ([text] if kind == "outputEntry" else [text, f"v {text}"]):
        try:
            tree = ast.parse(source, mode="eval")
        except (SyntaxError, ValueError):
            continue
        return sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in FOREIGN_LITERALS})
    return []


def _first_cycle(nodes: list[str], after: dict[str, list[str]]) -> list[str] | None:
    """A cycle of the graph ``after`` (node -> its successors), as the list of its nodes from the
    first one met in ``nodes`` order; None when there is none."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    for root in nodes:
        if root in state:
            continue
        path: list[str] = [root]
        todo: list[list[str]] = [list(after[root])]
        state[root] = 1
        while path:
            if not todo[-1]:
                state[path.pop()] = 2
                todo.pop()
                continue
            nxt = todo[-1].pop(0)
            if state.get(nxt) == 1:
                return path[path.index(nxt):]
            if nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(list(after[nxt]))
    return None


def _java_api_calls(tree: ast.AST) -> list[str]:
    """The calls of Java's console (``System.out.println``) and of jBPM's process context
    (``kcontext.setVariable``) in a script: no context value has them."""
    return sorted({ast.unparse(n.func) for n in ast.walk(tree)
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                   and (ast.unparse(n.func).startswith(("System.out.", "System.err."))
                        or isinstance(n.func.value, ast.Name) and n.func.value.id == "kcontext")})


def _past_indentation(text: str, err: SyntaxError) -> SyntaxError:
    """The error that says why a script of another language is no Python: an indented one (a
    script in an indented CDATA block) first fails on its indentation, which hides the real reason
    (``def x = 1`` in Groovy); the error of the script dedented, when it has one, else ``err``."""
    if not isinstance(err, IndentationError):
        return err
    try:
        ast.parse(textwrap.dedent(text), mode="exec")
    except SyntaxError as deeper:
        return deeper
    return err


def _java_signals(tree: ast.AST) -> list[str]:
    """The signal names a jBPM script raises (``kcontext.getKnowledgeRuntime().signalEvent("name", ...)``,
    ``kcontext.getProcessInstance().signalEvent(...)``): in BPMN here, a signal throw event's job."""
    return sorted({n.args[0].value for n in ast.walk(tree)
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "signalEvent"
                   and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
                   and ast.unparse(n.func).startswith("kcontext.")})


def _java_script_instead(source: str) -> str | None:
    """A jBPM script of ``System.out.println(...)`` and ``kcontext.setVariable("x", v)`` lines
    as Python (``print(...)``, ``x = v``), when nothing else of Java's API is left; else None."""
    lines = []
    for line in source.strip().splitlines():
        line = line.strip().rstrip(";").strip()
        line = re.sub(r"\bSystem\.(?:out|err)\.print(?:ln)?\(", "print(", line)
        line = re.sub(r"\bkcontext\.getVariable\(\s*(['\"])([A-Za-z_]\w*)\1\s*\)", r"\2", line)
        setter = re.fullmatch(r"kcontext\.setVariable\(\s*(['\"])([A-Za-z_]\w*)\1\s*,\s*(.+)\)", line)
        value = setter.group(3).strip() if setter else ""
        value = {"true": "True", "false": "False", "null": "None"}.get(value, value)
        lines.append(f"{setter.group(2)} = {value}" if setter else line)
    text = "\n".join(lines)
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    return None if _java_api_calls(tree) or _camunda_api_calls(tree) else text


def _operators_instead(source: str) -> str | None:
    """``a > 1 && !b`` (JavaScript's or Java's operators in a Python condition): ``a > 1 and not b``."""
    pairs = ((r"===", "=="), (r"!==", "!="), (r"&&", " and "), (r"\|\|", " or "), (r"!(?!=)", " not "))
    spelt = _javascript_expression_instead(source)
    for pattern, python in pairs:
        spelt = re.sub(pattern, python, spelt)
    spelt = " ".join(spelt.split())
    if spelt == " ".join(source.split()) or python_source(spelt) is None:
        return None
    return spelt


_JAVA_EQUALS = re.compile(r"""("[^"]*"|'[^']*'|[A-Za-z_]\w*)\.(equals|equalsIgnoreCase)\(\s*([^()]*?)\s*\)""")


def _java_return_instead(source: str) -> str | None:
    """What to write for a condition written as a Java statement (jBPM's, Kogito's:
    ``return "yes".equalsIgnoreCase(suspended);``): a condition is an expression, so no
    ``return`` and no ``;``; ``a.equals(b)`` is ``a == b``, ``"x".equalsIgnoreCase(v)``
    ``v.lower() == "x"``. None when it is no such statement; the instruction alone when some
    other Java method is called (a context value is JSON: it has no methods)."""
    text = source.strip()
    if not re.match(r"return\s", text) and not text.endswith(";"):
        return None
    inner = re.sub(r"^return\s+", "", text).rstrip(";").strip()

    def equals(m: re.Match[str]) -> str:
        left, how, right = m.group(1), m.group(2), m.group(3)
        if how == "equals":
            return f"{right} == {left}" if left[0] in "\"'" else f"{left} == {right}"
        if left[0] in "\"'":
            return f"{right}.lower() == {left.lower()}"
        return f"{left}.lower() == {right}.lower()"

    spelt = _JAVA_EQUALS.sub(equals, inner)
    spelt = _operators_instead(spelt) or spelt
    said = "a condition is an expression: no 'return', no ';'"
    if re.search(r"\w\.(?!lower\(\))[A-Za-z_]\w*\(", spelt) or python_source(spelt) is None:
        return (f"{said}, and it is Python over the context, whose values have no Java methods: write the test "
                f"of {inner!r} in Python")
    return f"{said}; write {spelt!r}"


def _tokens_with_offsets(source: str) -> tuple[list[Any], Callable[[tuple[int, int]], int]] | None:
    """Python's tokens of ``source`` and the offset in it of a token's (row, column); None when it
    does not tokenize."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(at: tuple[int, int]) -> int:
        return starts[at[0] - 1] + at[1]

    return tokens, offset


def _spaced_names_instead(source: str) -> tuple[list[tuple[str, str]], str] | None:
    """A condition that reads a name with spaces (``Credit Score > 600``, MIWG C.3.0's ``Service
    Level == 'Premium'``: a modeler's label, or a form field's): Python reads two names side by side,
    a syntax error. Returns each spaced name with the Python name to write instead (its words in
    lower case joined by underscores), and the condition so written, when that is valid Python."""
    import keyword
    import tokenize

    tokenized = _tokens_with_offsets(source)
    if tokenized is None:
        return None
    tokens, offset = tokenized

    runs: list[list[tokenize.TokenInfo]] = []
    previous: tokenize.TokenInfo | None = None
    for tok in tokens:
        word = tok.type == tokenize.NAME and not keyword.iskeyword(tok.string)
        if word and previous is not None and runs and runs[-1][-1] is previous \
                and source[offset(previous.end):offset(tok.start)].strip(" \t") == "":
            runs[-1].append(tok)
        elif word:
            runs.append([tok])
        previous = tok
    spaced = [run for run in runs if len(run) > 1]
    if not spaced:
        return None
    written, names, at = [], [], 0
    for run in spaced:
        start, end = offset(run[0].start), offset(run[-1].end)
        name = "_".join(t.string.lower() for t in run)
        names.append((source[start:end], name))
        written += [source[at:start], name]
        at = end
    instead = "".join(written) + source[at:]
    try:
        ast.parse(instead, mode="eval")
    except SyntaxError:
        return None
    return names, instead


def _compares_values(source: str) -> bool:
    """Whether an expression compares with ``==``, ``<``, ``in``, ... (not ``is``) or holds a number
    or a string: what tells ``amount > 5 and Risk Level in ("high",)`` from a sentence such as
    "the applicant is reliable", which joined up parses as well."""
    tree = ast.parse(source, mode="eval")
    return any(isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value is not None
               or isinstance(node, ast.Compare) and any(not isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
               for node in ast.walk(tree))


def _keyword_names_instead(source: str) -> tuple[list[str], str] | None:
    """An expression that reads a key named like a Python keyword (SpiffWorkflow's collaboration test
    correlates on ``from.name``, a message payload's ``from``; a form field ``class`` read by its bare
    name, ``class == 'gold'``): Python cannot name it, a syntax error. Returns the keywords so read and
    the expression written to read them, ``globals()['from']['name']``, ``globals()['class']`` (an
    expression's context is its globals, and JSON objects are read by key), when that is valid Python.
    A bare keyword is taken for a key only when no expression uses it (``class``, ``from``, not
    ``not``, ``in``, ``if``, ``for``, ``lambda``)."""
    import keyword
    import tokenize

    tokenized = _tokens_with_offsets(source)
    if tokenized is None:
        return None
    tokens = [t for t in tokenized[0] if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER)]
    offset = tokenized[1]

    def touching(a: tokenize.TokenInfo, b: tokenize.TokenInfo) -> bool:
        return a.end == b.start

    edits: list[tuple[int, int, str]] = []
    named: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        prev = tokens[i - 1] if i else None
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if tok.type != tokenize.NAME or not keyword.iskeyword(tok.string) or tok.string in ("True", "False", "None"):
            i += 1
            continue
        if prev is not None and prev.string == "." and touching(prev, tok):
            edits.append((offset(prev.start), offset(tok.end), f"[{tok.string!r}]"))
        elif nxt is not None and nxt.string in (".", "[") and touching(tok, nxt):
            edits.append((offset(tok.start), offset(tok.end), f"globals()[{tok.string!r}]"))
            while i + 2 < len(tokens) and tokens[i + 1].string == "." and tokens[i + 2].type == tokenize.NAME \
                    and touching(tokens[i], tokens[i + 1]) and touching(tokens[i + 1], tokens[i + 2]):
                edits.append((offset(tokens[i + 1].start), offset(tokens[i + 2].end), f"[{tokens[i + 2].string!r}]"))
                i += 2
        elif tok.string not in _EXPRESSION_KEYWORDS and (prev is None or prev.string != "."):
            edits.append((offset(tok.start), offset(tok.end), f"globals()[{tok.string!r}]"))
        else:
            i += 1
            continue
        named.append(tok.string)
        i += 1
    if not edits:
        return None
    rewritten = source
    for start, end, text in sorted(edits, reverse=True):
        rewritten = rewritten[:start] + text + rewritten[end:]
    try:
        ast.parse(rewritten, mode="eval")
    except SyntaxError:
        return None
    return list(dict.fromkeys(named)), rewritten


#: the keywords an expression uses as Python (``x if c else y``, ``[v for v in vs]``, ``yield from``): a bare
#: one of these is no key; any other keyword in an expression (``class``, ``from``, ``import``) can only be one
_EXPRESSION_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "if", "else", "for", "lambda", "await", "async",
                                  "yield", "True", "False", "None"})


def _keyword_names_said(names: list[str], instead: str) -> str:
    shown = ", ".join(repr(n) for n in names)
    keys = " or ".join(f"a key named {n!r}" for n in names)
    return (f"{shown} {'is a Python keyword' if len(names) == 1 else 'are Python keywords'}, so {keys} cannot be "
            f"read by its name (an expression reads the context as its globals(), and JSON objects by key): "
            f"write {instead!r}")


def _spaced_names_said(names: list[tuple[str, str]], instead: str) -> str:
    shown = ", ".join(f"{spaced!r}" for spaced, _ in names)
    keys = ", ".join(name for _, name in names)
    return (f"{shown} {'is a name' if len(names) == 1 else 'are names'} with spaces, which Python reads as "
            f"names side by side; a condition reads a context key by its Python name (letters, digits and "
            f"underscores): name the key {keys} where it is set (the form field, the step's answer, the start "
            f"data) and write {instead!r}")


def _operators_said(source: str) -> str:
    """What ``_operators_instead`` rewrote, in Python's words: its operators, a length, a ';'."""
    said = ["and, or, not"] if re.search(r"&&|\|\||===|!==|!(?!=)", source) else []
    said += ["len(x) for x.length"] if _JAVASCRIPT_LENGTH.search(source) else []
    said += ["no ';' after an expression"] if source.strip().endswith(";") else []
    return ", ".join(said) or "a variable by its name"


def _named_getters(tree: ast.AST) -> list[tuple[str, str]]:
    """The calls of a function that is no builtin, named get..., with one argument, a variable name
    in quotes (``getDataObject('approved')``): (the call as written again, the name)."""
    return sorted({(f"{n.func.id}({n.args[0].value!r})", n.args[0].value) for n in ast.walk(tree)
                   if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id.lower().startswith("get")
                   and not hasattr(builtins, n.func.id) and len(n.args) == 1 and not n.keywords
                   and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
                   and n.args[0].value.isidentifier()})


def _getters_instead(tree: ast.AST) -> str:
    """The expression with each ``_named_getters`` call replaced by the name it reads."""
    class _ByName(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.expr:
            self.generic_visit(node)
            if (isinstance(node.func, ast.Name) and node.func.id.lower().startswith("get") and len(node.args) == 1
                    and not hasattr(builtins, node.func.id) and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str) and node.args[0].value.isidentifier()):
                return ast.Name(id=node.args[0].value, ctx=ast.Load())
            return node

    return ast.unparse(_ByName().visit(ast.parse(ast.unparse(tree), mode="eval")))


class _JavaValueMethods(ast.NodeTransformer):
    """Java's methods of a string, list or map in a JUEL expression, as Python writes them:
    ``s.equals("x")`` is ``s == "x"``, ``s.trim()`` ``s.strip()``, ``items.size()`` ``len(items)``,
    ``items.contains(x)`` ``x in items``, ``s.isEmpty()`` ``not s``, ... (``changed`` says whether
    any was met). Other methods are left: a bean's (``scoring.compute()``) is named as one."""

    def __init__(self) -> None:
        self.changed = False

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        func, args = node.func, node.args
        if not isinstance(func, ast.Attribute) or node.keywords or (
                isinstance(func.value, ast.Name) and func.value.id in ("execution", "task")):
            return node
        value, name = func.value, func.attr

        def method(of: ast.expr, python: str, *given: ast.expr) -> ast.expr:
            return ast.Call(func=ast.Attribute(value=of, attr=python, ctx=ast.Load()), args=list(given), keywords=[])

        new: ast.expr | None = None
        if name == "equals" and len(args) == 1:
            new = ast.Compare(left=value, ops=[ast.Eq()], comparators=[args[0]])
        elif name == "equalsIgnoreCase" and len(args) == 1:
            new = ast.Compare(left=method(value, "lower"), ops=[ast.Eq()], comparators=[method(args[0], "lower")])
        elif name in ("contains", "containsKey") and len(args) == 1:
            new = ast.Compare(left=args[0], ops=[ast.In()], comparators=[value])
        elif name in ("startsWith", "endsWith") and len(args) == 1:
            new = method(value, name.lower(), args[0])
        elif not args and name in _JAVA_NO_ARGUMENT:
            python = _JAVA_NO_ARGUMENT[name]
            if python == "not":
                new = ast.UnaryOp(op=ast.Not(), operand=value)
            elif python in ("len", "str"):
                new = ast.Call(func=ast.Name(id=python, ctx=ast.Load()), args=[value], keywords=[])
            else:
                new = method(value, python)
        if new is None:
            return node
        self.changed = True
        return new


_JAVA_NO_ARGUMENT = {"trim": "strip", "size": "len", "length": "len", "isEmpty": "not", "toUpperCase": "upper",
                     "toLowerCase": "lower", "toString": "str"}
_JSON_METHODS = frozenset(name for kind in (str, list, dict, int, float) for name in dir(kind) if not name.startswith("_"))


def _feel_timer_source(text: str) -> str:
    """A FEEL timer with Camunda's cycle() and duration() of an expression rewritten to the FEEL
    that gives its ISO 8601 text, which a timer here evaluates to: ``=cycle(duration("PT10M"))``
    repeats "PT10M" forever ("R/PT10M"), ``cycle(3, ...)`` three times; ``duration(x)`` is x."""
    source = text.strip()
    cycle = re.fullmatch(r"=\s*cycle\(\s*(?:(\d+)\s*,\s*)?duration\(\s*(\"[^\"]*\"|'[^']*')\s*\)\s*\)", source)
    if cycle is not None:
        return f'="R{cycle.group(1) or ""}/{cycle.group(2)[1:-1]}"'
    whole = re.fullmatch(r"=\s*duration\((.*)\)", source, re.S)
    if whole is not None and _balanced(whole.group(1)):
        source = "=" + whole.group(1)
    return re.sub(r"(?<![\w.])string\s*\(", "str(", source)


def _feel_clock_timer(tag: str, text: str) -> str | None:
    """What to write for a Camunda 8 timeDate read off the clock, which the context has no function
    for: ``=now() + duration("PT1H")`` is a duration from when the timer starts waiting, a
    timeDuration here (on the engine's clock); ``=today() + duration("P1D")`` is a date, which
    Python's datetime module computes. None for any other timer."""
    if tag != "timeDate":
        return None
    source = text.strip()
    now = re.fullmatch(r"=\s*now\(\s*\)\s*(?:\+\s*(.+))?", source, re.S)
    if now is not None:
        added = (now.group(1) or "").strip()
        if not added:
            duration = '"PT0S"'
        else:
            inner = _feel_timer_source("=" + added)
            literal = re.fullmatch(r"=\s*(\"[^\"]*\"|'[^']*')", inner)
            if literal is not None:
                duration = '"' + literal.group(1)[1:-1] + '"'
            else:
                told = _python_instead(inner, "FEEL")
                if not told.startswith("write '") or "(" in told.split("'")[-1]:
                    return None
                duration = told[len("write '"):].rsplit("'", 1)[0]
        what = (f"so {source[1:].strip()!r} is a duration from then" if added else
                "so it is due at once, a duration of nothing")
        return (f"now() is when the timer starts waiting, {what}: "
                f"make the timer a timeDuration, <bpmn:timeDuration xsi:type=\"bpmn:tFormalExpression\">"
                f"{duration}</bpmn:timeDuration> in place of the timeDate (due that long after the timer starts, "
                "on the engine's clock)")
    today = re.fullmatch(r"=\s*today\(\s*\)\s*(?:\+\s*duration\(\s*([\"'])P(\d+)([DW])\1\s*\))?", source)
    if today is not None:
        days = int(today.group(2) or 0) * (7 if today.group(3) == "W" else 1)
        python = ('str(__import__("datetime").date.today() + __import__("datetime").timedelta(days=' + str(days) + "))"
                  if days else 'str(__import__("datetime").date.today())')
        return (f"today() is no function here; the date is Python's datetime module's: write {python!r} "
                "(midnight of that day, local time)")
    return None


def _balanced(text: str) -> bool:
    """Whether the parentheses of ``text`` close in order (quoted text aside)."""
    depth = 0
    for char in re.sub(r"\"[^\"]*\"|'[^']*'", "", text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def _written_and_notes(told: str) -> tuple[str, str]:
    """``_python_instead``'s advice after its "write ": the Python it quotes (a ``repr``), and the
    notes that follow it in parentheses (with their leading space), if any."""
    ends = [i for i in range(len(told)) if told.startswith(" (", i)] + [len(told)]
    for end in ends:
        try:
            expression = ast.literal_eval(told[:end])
        except (ValueError, SyntaxError):
            continue
        if isinstance(expression, str):
            return expression, told[end:]
    return told, ""


# Camunda Spin's JSON API: S(json), .prop("key"), and the getters of a value
_SPIN_PROP = re.compile(r"\.prop\(\s*(['\"])([^'\"]*)\1\s*\)")
_SPIN_VALUE = re.compile(r"\.(?:numberValue|stringValue|boolValue|value|elements)\(\s*\)")
_SPIN_S = re.compile(r"(?<![\w.])S\(\s*([A-Za-z_]\w*)\s*\)")


def _spin_said(expression: str) -> str:
    """The Spin calls an expression makes (``.prop("age"), .numberValue()``), "" when none."""
    if not _SPIN_PROP.search(expression):
        return ""
    found = [m.group(0) for pattern in (_SPIN_PROP, _SPIN_VALUE) for m in pattern.finditer(expression)]
    return ", ".join(dict.fromkeys(f.replace(" ", "") for f in found))


def _spin_instead(expression: str) -> str:
    """``customer.prop("age").numberValue()`` as ``customer["age"]``: a JSON object is a dict here."""
    if not _SPIN_PROP.search(expression):
        return expression
    expression = _SPIN_S.sub(r"\1", expression)
    expression = _SPIN_PROP.sub(lambda m: f"[{json.dumps(m.group(2))}]", expression)
    return _SPIN_VALUE.sub("", expression)


def _completion_condition_activity(el: Any) -> str | None:
    """The id of the activity whose multi-instance completionCondition ``el`` is; None for anything else."""
    if el is None or el.tag != _bpmn("completionCondition"):
        return None
    loop = el.getparent()
    activity = loop.getparent() if loop is not None else None
    return activity.get("id") if activity is not None else None


def _waits_for_every_instance(source: str) -> bool:
    """Camunda's ``${nrOfCompletedInstances == nrOfInstances}`` (or ``>=``, either way round): true once
    every instance has completed, which needs no completionCondition at all."""
    inner = re.sub(r"^[$#]\{(.*)\}$", r"\1", source.strip(), flags=re.S).strip()
    try:
        tree = ast.parse(inner, mode="eval").body
    except SyntaxError:
        return False
    if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.left, ast.Name)
            and isinstance(tree.comparators[0], ast.Name)):
        return False
    left, right, op = tree.left.id, tree.comparators[0].id, tree.ops[0]
    done, total = "nrOfCompletedInstances", "nrOfInstances"
    return ((left, right) == (done, total) and isinstance(op, (ast.Eq, ast.GtE))) or \
        ((left, right) == (total, done) and isinstance(op, (ast.Eq, ast.LtE)))


def _python_instead(source: str, dialect: str) -> str:
    """What to write instead of another engine's expression: its Python twin when a plain
    rewrite of the operators gives one, else the instruction."""
    inner = source.strip()
    pairs: tuple[tuple[str, str], ...]
    if dialect == "JUEL":
        inner = inner[2:-1]
        pairs = _JUEL_OPERATORS
    else:  # FEEL: = is equality, and/or/not() are Python's already
        inner = inner[1:]
        # is defined(x): whether the process holds x, which a condition asks its namespace
        # ('x' in locals()), in layerflow as in SpiffWorkflow; not(...) of it is "not in"
        inner = re.sub(r"(?<![\w.])not\s*\(\s*is defined\(\s*([A-Za-z_]\w*)\s*\)\s*\)", r"'\1' not in locals()",
                       inner)
        inner = re.sub(r"(?<![\w.])is defined\(\s*([A-Za-z_]\w*)\s*\)", r"'\1' in locals()", inner)
        pairs = ((r"(?<![<>!=])=(?!=)", "=="), (r"\bnull\b", "None"), (r"\btrue\b", "True"), (r"\bfalse\b", "False"))
    for pattern, python in pairs:
        inner = re.sub(pattern, python, inner)
    spin = _spin_said(inner)
    inner = _spin_instead(inner)
    inner = _javascript_expression_instead(inner)
    inner = re.sub(r"(?<![\w.])(?:count|size|length)\s*\(", "len(", inner)
    if dialect == "FEEL":
        inner = re.sub(r"(?<![\w.])string\s*\(", "str(", inner)  # FEEL's string(x): Python's str(x)
    # FEEL's temporal literals are ISO 8601 text, which is what a timer here evaluates to
    inner = _FEEL_TEMPORAL.sub(lambda m: m.group(2), inner)
    inner = " ".join(inner.split())
    try:
        tree = ast.parse(inner, mode="eval")
    except SyntaxError:
        return "rewrite it as a Python expression over the process variables"
    if dialect == "JUEL":
        java = _JavaValueMethods()
        tree = java.visit(tree)
        if java.changed:
            inner = ast.unparse(tree)  # Java's methods of a value (s.trim(), list.size()) as Python's
    if _attribute_paths(tree):
        inner = _keys_instead(tree)  # FEEL's and JUEL's paths into an object: its keys here
    calls = sorted({n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                    and n.func.id in _FOREIGN_FUNCTIONS})
    left = [f"{dialect}'s {name}(): {_FOREIGN_FUNCTIONS[name]}" for name in calls]
    attribute_calls = sorted({ast.unparse(n.func) for n in ast.walk(tree)
                              if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                              and isinstance(n.func.value, ast.Name) and n.func.value.id in ("execution", "task")})
    left += [f"{name}() is Camunda's API, which is not here: read the variable by its name" for name in attribute_calls]
    left += [f"{name} is a JavaScript engine's (bpmn-engine's) runtime, which is not here: compute the value in a "
             "handler (handler: file.py:function in a task's config) and read it by its name"
             for name in _javascript_api(tree)]
    if dialect == "JUEL":
        # ${orderBusinessLogic.getOrder(orderId).approved}, ${scoring.compute()}: a Java bean of the
        # Camunda application (a Spring or CDI bean) and its method, camelCase or one that no JSON
        # value has; context values are JSON, and have no such methods
        beans = sorted({f"{n.func.value.id}.{n.func.attr}()" for n in ast.walk(tree)
                        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                        and isinstance(n.func.value, ast.Name) and n.func.value.id not in ("execution", "task")
                        and (re.fullmatch(r"[a-z]+[A-Z]\w*", n.func.attr) or n.func.attr not in _JSON_METHODS)})
        left += [f"{name} calls a Java bean of the Camunda application, which is not here: compute the value in a "
                 "handler (handler: file.py:function in the config of a task before it) and read it by its name"
                 for name in beans]
    if spin:
        left.insert(0, f"Camunda Spin's JSON API ({spin}): a JSON object here is a dict, read by its keys")
    counters = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in _CAMUNDA_LOOP_NAMES})
    left += [f"{name} is a multi-instance counter Camunda sets and SpiffWorkflow does not: "
             + ("the number of instances is the size of the input collection (loopDataInputRef), len(...)"
                if name == "nrOfInstances" else "count the output collection (loopDataOutputRef) instead, len(...)")
             for name in counters]
    return f"write {inner!r}" + (f" ({'; '.join(left)})" if left else "")


_SPLIT_MARKERS = frozenset(BRANCH_MARKERS)


_TIMER_TEXT = {"timeDuration": ("duration", '"PT15M" or "P2DT12H"'),
               "timeDate": ("date and time", '"2026-01-05T09:00:00+00:00"'),
               "timeCycle": ("repeating interval", '"R3/PT1H" or "R/P1D"')}


def _jbpm_duration_iso(text: str) -> str | None:
    """``"PT1H30M"`` (quoted) for jBPM's ``1h30m``; None for anything else."""
    match = _JBPM_DURATION.fullmatch(text.strip())
    if match is None or not any(match.groups()):
        return None
    days, hours, minutes, seconds, millis = (int(g) if g else 0 for g in match.groups())
    secs = f"{seconds + millis / 1000:.3f}".rstrip("0").rstrip(".") if millis else str(seconds)
    clock = "".join(f"{n}{unit}" for n, unit in ((hours, "H"), (minutes, "M")) if n) + \
        (f"{secs}S" if seconds or millis else "")
    return f'"P{f"{days}D" if days else ""}{f"T{clock}" if clock else ""}"'


# Groovy's or Java's `throw new org.flowable.engine.delegate.BpmnError("code"[, "message"]);` (Flowable,
# Activiti, Camunda 7's org.camunda.bpm.engine.delegate.BpmnError): one statement that throws a BPMN error
_BPMN_ERROR_THROW = re.compile(r'throw\s+new\s+(?P<cls>(?:[A-Za-z_]\w*\.)*BpmnError)\s*\(\s*"(?P<code>[^"\\]*)"'
                               r'(?:\s*,\s*"(?P<message>[^"\\]*)")?\s*\)\s*;?')
_JUEL_IN_TEXT = re.compile(r"[$#]\{([^{}]*)\}")


def _juel_in_timer_said(tag: str, text: str) -> str:
    """What a timer's ISO 8601 text with JUEL inside it (``R5/PT10S/${date:format(end)}``, Flowable's
    cycle that stops at a date) is, and the Python expression to write."""
    parts: list[str] = []
    dates: list[str] = []
    at = 0
    for found in _JUEL_IN_TEXT.finditer(text):
        if found.start() > at:
            parts.append(json.dumps(text[at:found.start()]))
        inner = found.group(1).strip()
        formatted = re.fullmatch(r"date:format\(\s*([A-Za-z_]\w*)\s*\)", inner)
        if formatted:  # Flowable's date:format(x) writes the date x as ISO 8601 text
            dates.append(formatted[1])
            parts.append(formatted[1])
        else:
            parts.append(f"str({inner})" if inner.isidentifier() else "")
        at = found.end()
    if at < len(text):
        parts.append(json.dumps(text[at:]))
    held = f" with {', '.join(dates)} holding the date as ISO 8601 text" if dates else ""
    todo = (f"write {' + '.join(parts)!r}{held}" if all(parts) else
            "write a Python expression that joins the ISO 8601 text and the context values it needs")
    said = (f"holds the JUEL expression{'s' if len(_JUEL_IN_TEXT.findall(text)) > 1 else ''} "
            f"{', '.join(m.group(0) for m in _JUEL_IN_TEXT.finditer(text))}, which the other engine fills in as the "
            f"timer starts; SpiffWorkflow reads the whole text as one Python expression over the context: {todo}")
    cycle = re.fullmatch(r"R(\d*)/(P[^/]+)/[$#]\{.*\}", text) if tag == "timeCycle" else None
    if cycle is not None:
        count = cycle[1] or "endless"
        said += (f"; SpiffWorkflow reads a date after the period as the end of the repetitions and fires first one "
                 f"period before it (the other engine reads it as the date the repetitions stop): for {count} "
                 f"repetitions {cycle[2]} apart, counted from when the timer starts, write \"R{cycle[1]}/{cycle[2]}\"")
    return said


def _timer_text_problem(tag: str, text: str) -> str | None:
    """Why SpiffWorkflow (as the engine calls it) cannot read ``text`` as the value of a timer's
    ``tag``; None when it can."""
    from SpiffWorkflow.bpmn.specs.event_definitions.timer import TimerEventDefinition

    from .spiff import _parse_cycle, parse_duration

    try:
        if tag == "timeDuration":
            parse_duration(text)
        elif tag == "timeDate":
            if not isinstance(TimerEventDefinition.parse_time_or_duration(text), datetime):
                return "no date"
        else:
            _parse_cycle(text, datetime.now(timezone.utc))
    except Exception as err:  # noqa: BLE001 - SpiffWorkflow's parsers raise bare Exception, ValueError, AttributeError
        return str(err) or type(err).__name__
    return None


def _defined_beside(process_id: str, given: Sequence[Path]) -> Path | None:
    """A .bpmn file in the folder of a given file, not given itself, that defines ``process_id``
    (read as text: a hint for the message, not a parse)."""
    pattern = re.compile(rf"<(?:\w+:)?process\b[^>]*\bid=[\"']{re.escape(process_id)}[\"']")
    seen = {p.resolve() for p in given}
    for folder in dict.fromkeys(p.parent for p in given):  # as the user wrote it, relative or not
        for candidate in sorted(folder.glob("*.bpmn")):
            if candidate.resolve() in seen:
                continue
            try:
                if pattern.search(candidate.read_text(encoding="utf-8", errors="replace")):
                    return candidate
            except OSError:
                continue
    return None


def _section_meant(key: str) -> str:
    """The hint for a config file's top-level key that is no element id but looks like one of its
    sections (``sytem:``, ``data_layer:``, ``Data-Layers:``): read as an element id, it would only be
    named as an id that does not exist, among the process's ids."""
    plain = key.lower().replace("-", "_")
    close = difflib.get_close_matches(plain, RESERVED_KEYS, n=1, cutoff=0.8)
    return f" (did you mean the section '{close[0]}:'?)" if close else ""


def _did_you_mean(word: str, candidates: Iterable[str]) -> str:
    pool = [c for c in candidates if c]
    close = difflib.get_close_matches(word, pool, n=3, cutoff=0.6)
    close += [c for c in pool if c.lower() == word.lower() and c not in close]
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _pydantic_problems(err: ValidationError) -> list[dict[str, Any]]:
    from context_layers.config import format_validation_error

    return format_validation_error(err)


def _config_message(message: str) -> str:
    message = message.removeprefix("Value error, ")
    if ";" in message:
        return message
    if message.startswith("Field required"):
        return f"{message}; add this field"
    return f"{message}; correct this value"


_FEEL_RANGE = re.compile(r"([\[\](])\s*(.+?)\s*\.\.\s*(.+?)\s*([\[\])])")


_FEEL_DURATION = re.compile(r"(?<!\w)(?<!\w\.)duration\s*\(\s*(\"[^\"]*\"|'[^']*')\s*\)")
_YEAR_MONTH = re.compile(r"P(?:(\d+)Y)?(?:(\d+)M)?")
_DAYS = re.compile(r"P(\d+)D")


def _duration_test_instead(text: str) -> str:
    """What to write for an input entry that compares FEEL durations (``< duration("P1M")``,
    ``[duration("P1M")..duration("P2M")[``): the same test over a number of months (or days),
    as ISO 8601 durations do not compare in order as text."""
    said = ("FEEL's duration(...) is no function here, and ISO 8601 durations do not compare in order as text "
            "(\"P10D\" sorts before \"P2D\", \"P1Y\" before \"P6M\"): give the input as a number of months (or "
            "days) and compare numbers")
    values = [m.group(1)[1:-1] for m in _FEEL_DURATION.finditer(text)]
    if values and all(_YEAR_MONTH.fullmatch(v) and v != "P" for v in values):
        unit = "months"
        numbers = {v: int(_YEAR_MONTH.fullmatch(v).group(1) or 0) * 12 + int(_YEAR_MONTH.fullmatch(v).group(2) or 0)  # type: ignore[union-attr]
                   for v in values}
    elif values and all(_DAYS.fullmatch(v) for v in values):
        unit = "days"
        numbers = {v: int(_DAYS.fullmatch(v).group(1)) for v in values}  # type: ignore[union-attr]
    else:
        return said
    test = _FEEL_DURATION.sub(lambda m: str(numbers[m.group(1)[1:-1]]), text)
    test = _feel_range(test) or test
    return f"{said}: in {unit}, write {test!r}"


def _feel_range(text: str) -> str | None:
    """FEEL's interval ``[600..699]`` (``(`` or ``]`` opens it exclusive, ``)`` or ``[`` closes it so) as
    the Python test of ``?`` it means (``600 <= ? <= 699``); None when it is no interval of values."""
    found = _FEEL_RANGE.fullmatch(text.strip())
    if found is None:
        return None
    opening, low, high, closing = found.groups()
    if python_source(low) is None or python_source(high) is None:
        return None
    return f"{low} {'<=' if opening == '[' else '<'} ? {'<=' if closing == ']' else '<'} {high}"


def _feel_negation(text: str) -> str | None:
    """FEEL's ``not("LOW")`` (``not("a", "b")``, ``not([1..5])``) as the Python test of ``?`` it
    means (``? != "LOW"``, ``? not in ("a", "b")``, ``? < 1 or ? > 5``); None for anything else."""
    found = re.fullmatch(r"not\s*\((.*)\)", text.strip(), re.S)
    inner = found.group(1).strip() if found else ""
    if not inner:
        return None
    interval = _FEEL_RANGE.fullmatch(inner) if _feel_range(inner) else None
    if interval:  # outside the interval: below its start or above its end, as its brackets say
        opening, low, high, closing = interval.groups()
        return f"? {'<' if opening == '[' else '<='} {low} or ? {'>' if closing == ']' else '>='} {high}"
    values = _feel_value_list(inner)
    if values:
        return f"? not in ({', '.join(values)})"
    if "?" not in inner and python_source(inner) is not None and not re.match(r"[<>=!]", inner):
        return f"? != {inner}"
    return None


def _feel_value_list(text: str) -> list[str] | None:
    """The values of a DMN input entry that lists several (``"Fall","Winter"``, FEEL's "one of
    these"), as written; None for any other entry."""
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree.body, ast.Tuple) or len(tree.body.elts) < 2 or text.lstrip().startswith("("):
        return None  # a tuple in parentheses is Python's own, compared to an input that may be one
    values = [ast.get_source_segment(text, elt) for elt in tree.body.elts]
    return None if any(v is None for v in values) else [str(v) for v in values]


def _operation_called(task: Any) -> str:
    """What a service task's ``operationRef`` (BPMN's own implementation: an operation of a
    ``bpmn:interface``, as Eclipse's BPMN2 Modeler and jBPM write it, ``implementation="##WebService"``)
    names, for the message that says no handler runs it: layerflow calls no web service or class."""
    ref = task.get("operationRef", "").split(":")[-1]
    for interface in task.getroottree().getroot().iter(_bpmn("interface")):
        for operation in interface.iter(_bpmn("operation")):
            if operation.get("id") == ref:
                called = operation.get("implementationRef") or operation.get("name") or ref
                of = interface.get("implementationRef") or interface.get("name") or interface.get("id")
                return (f" (its operationRef {ref!r} names the operation {called!r} of interface {of!r}, "
                        f"which its engine calls as a web service or class; layerflow calls none)")
    return f" (its operationRef {ref!r} names no bpmn:operation of the file; layerflow calls none)"


def _named_apart(assoc: Any, targets: Mapping[str, Any], by_id: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(id, name) of each data object a dataOutputAssociation writes whose name (its own, or its
    reference's) is an identifier other than its id."""
    for ref_el in assoc.findall(_bpmn("targetRef")):
        reference = targets.get((ref_el.text or "").strip())
        if reference is None:
            continue
        obj = by_id.get(reference.get("dataObjectRef"))
        if obj is None:
            continue
        obj_id = obj.get("id")
        name = (obj.get("name") or reference.get("name") or "").strip()
        if name.isidentifier() and name != obj_id:
            yield obj_id, name
