"""The conflict-resolution chain of a join: policy, then the model, then a person.

``resolve_conflicts`` settles each conflict of a ``MERGE_WITH_CONFLICT_DETECT`` join
(other ``mergeStrategy`` values go to ``strategies.resolve_by_strategy``):

1. **policy** (``conflictPolicy``): the first rule for the key whose ``when`` holds
   sets its value and reason; when no rule holds, a ranking of the key's values
   settles it if every conflicting value is ranked. Rules come first because they
   are the more specific policy: they look at the context (``risk_level == "high"
   and amount > 100000``), a ranking only at the values ("rejected" beats
   "approved"), so a ranking is the fallback. A rule with ``confirm: true`` only
   suggests: a person decides (the model is not asked).
2. **model**: the ``ConflictArbiter``, if one is given. A malformed answer is
   retried once; a second malformed answer or any exception from the arbiter hands
   the conflict to a person, recording why. A model that cannot be reached (a refused
   connection, a timeout: the client's own retries spent) is not asked for the join's
   other conflicts: they go on to a person with a ``skipped`` step naming the failure. ``escalate: true`` hands it to a person
   with the model's value as the suggestion. The model is shown the conflict with the
   secrets hidden (the join's ``redact`` config); a conflict whose values are themselves
   secret (a key named like one, a value holding one) is not put to the model at all (a
   ``skipped`` step says why): it goes to a person.
3. **person**: the answer in ``answers`` under ``GATEWAY_ID/KEY`` (or ``*``) if
   present, else a pending ``HumanRequest`` if ``human_available``.

A conflict already put to a person (``asked``: the request as it was shown, by id)
and now answered is settled by that answer alone: policy and model are not run again,
so a model that answers differently the second time cannot overrule the person, and
the answer is checked against the options the person actually saw. An answer taken
by a timeout (``timed_out``) says so in its reason, and its resolver is not ``human``: nobody
answered, the join's configured default (``policy``) or the suggestion that stood in for it did.

A conflict that nothing settles, or that a person escalates, fails the join with one
``MergeConflictError`` naming every such key, branch and value: never a silent pick.
Every step is returned in ``ResolutionOutcome.steps`` for the tape.

Rule conditions see the context (``variables``) plus ``_key`` (the conflicting key),
``_values`` (the conflicting values in branch order) and ``_branches``. A rule whose
condition names an absent key, or fails on the data, does not apply (a step says
why); a condition outside the safe subset is a config error and raises.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from context_layers.config import ActivityExtensionConfig, ConflictPolicy
from context_layers.errors import ConfigError
from context_layers.hooks import RedactSetting, redact_for_model, redact_text, secret_key

from .arbiter import ArbiterAnswerError, ArbitrationAnswer, ArbitrationRequest, ConflictArbiter, from_json_value
from .conflicts import DELETED, MergedConflict, Resolution, brief_json, conflict_error, jsonable, same_value
from .expressions import ExpressionError, check_expression, evaluate, evaluate_condition, expression_names
from .strategies import ReducerError, json_type, reduce_values, resolve_by_strategy

__all__ = [
    "ESCALATE",
    "ESCALATION_IS_FINAL",
    "SETTLE_FAILED_JOIN",
    "HumanRequest",
    "InvalidAnswerError",
    "ResolutionOutcome",
    "ResolutionStep",
    "build_human_request",
    "default_fits",
    "default_for",
    "evaluate",
    "evaluate_condition",
    "match_answer",
    "resolve_by_policy",
    "resolve_conflicts",
    "unfit_option",
]

ESCALATE = "$escalate"
# what settles a join that failed on its conflicts (a person escalated one, FAIL_ON_CONFLICT): no
# answer or value written into a context does, as the join merges its branches again
SETTLE_FAILED_JOIN = ("an administrator settles it with a conflictPolicy rule (without confirm) or another "
                      "mergeStrategy for this join, given as runtime config (POST /api/context-governance/config), "
                      "then resumes the instance")
ESCALATION_IS_FINAL = f"An escalation is final: {SETTLE_FAILED_JOIN}"
CONFLICT_CONFIRMATION = "conflict_resolution"
# how a model step begins when the model was not asked, having been unreachable for an earlier key of the join
MODEL_NOT_ASKED = "not asked: the model could not be reached"


class InvalidAnswerError(ConfigError):
    """An answer that is none of the offered options."""


@dataclass(frozen=True)
class ResolutionStep:
    """One step of the chain for one key, for the tape."""

    key: str
    resolver: str  # policy | model | human | strategy
    outcome: str  # resolved | suggested | skipped | failed | escalated | pending | answered | timed_out
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "resolver": self.resolver, "outcome": self.outcome, "detail": self.detail}


@dataclass(frozen=True)
class HumanRequest:
    """A ``human_confirm`` for a conflict. ``id`` is ``GATEWAY_ID/KEY``: the CLI's
    ``--answers`` and ``--answer`` use it. Option values are JSON (``{"$deleted":
    true}`` for a deletion, ``"$escalate"`` to escalate)."""

    id: str
    message: str
    options: list[dict[str, Any]]
    timeout: float
    default: Any
    type: str = CONFLICT_CONFIRMATION
    on_timeout: str = "default"  # "default" | "escalate"
    gateway_id: str = ""
    key: str = ""
    suggested: Any = None
    suggested_by: str | None = None  # "policy" | "model" | None
    suggested_reason: str | None = None
    # whose ``default`` it is: "config" (the join's humanConfirm), "policy" or "model" (no default
    # configured: the suggestion stands in), None (no default, or a record written before this was kept)
    default_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "message": self.message, "options": self.options,
                "timeout": self.timeout, "default": self.default, "on_timeout": self.on_timeout,
                "gateway_id": self.gateway_id, "key": self.key,
                "suggested": None if self.suggested_by is None else jsonable(self.suggested),
                "suggested_by": self.suggested_by, "suggested_reason": self.suggested_reason,
                "default_by": self.default_by}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HumanRequest":
        """The request back from ``to_dict`` (extra fields, e.g. a stored answer, are ignored)."""
        by = data.get("suggested_by")
        return cls(id=str(data["id"]), message=str(data.get("message", "")), options=list(data.get("options") or []),
                   timeout=float(data.get("timeout") or 300.0), default=data.get("default"),
                   type=str(data.get("type") or CONFLICT_CONFIRMATION), on_timeout=str(data.get("on_timeout") or "default"),
                   gateway_id=str(data.get("gateway_id") or ""), key=str(data.get("key") or ""),
                   suggested=None if by is None else from_json_value(data.get("suggested")), suggested_by=by,
                   suggested_reason=data.get("suggested_reason"), default_by=data.get("default_by"))

    @property
    def suggestion(self) -> Resolution | None:
        if self.suggested_by is None:
            return None
        return Resolution(self.suggested, self.suggested_by, self.suggested_reason or "")


@dataclass(frozen=True)
class ResolutionOutcome:
    resolved: list[tuple[MergedConflict, Resolution]]
    pending: list[HumanRequest]
    steps: list[ResolutionStep] = field(default_factory=list)


def _sentence(text: str) -> str:
    """``text`` as a sentence of its own: a designer's message or a reason written without a final
    full stop would run into the sentence the prompt puts after it."""
    text = str(text).strip()
    return text if text.endswith((".", "!", "?", "…")) else f"{text}."


def _show(value: Any) -> str:
    return brief_json(value)  # a question or a reason quotes a value; its record keeps it whole


def _rule_variables(conflict: MergedConflict, variables: Mapping[str, Any]) -> Mapping[str, Any]:
    extra = {"_key": conflict.key, "_values": [jsonable(v) for v in conflict.conflicting_values.values()],
             "_branches": list(conflict.source_branches)}
    return ChainMap(extra, variables)  # type: ignore[arg-type]


def resolve_by_policy(
    conflict: MergedConflict,
    policy: ConflictPolicy,
    variables: Mapping[str, Any],
    *,
    steps: list[ResolutionStep] | None = None,
) -> Resolution | None:
    """The policy's answer for ``conflict``: the first rule for the key whose condition
    holds (``needs_human`` set for a ``confirm`` rule), else the key's ranking when it
    ranks every conflicting value, else ``None``. Skipped rules and an incomplete
    ranking are noted in ``steps``."""
    notes = steps if steps is not None else []
    key = conflict.key
    scope = _rule_variables(conflict, variables)
    unevaluated = []  # rules the ranking stands in for without their condition read: a key absent, a typo
    for index, rule in enumerate(policy.rules):
        if not fnmatch.fnmatchcase(key, rule.key):
            continue
        check_expression(rule.when)  # a condition outside the safe subset is a config error: raise
        try:
            holds = evaluate_condition(rule.when, scope)
        except ExpressionError as err:
            notes.append(ResolutionStep(key, "policy", "skipped", f"rule {index} does not apply: {err}"))
            unevaluated.append(f"rule {index} (when {rule.when!r}) did not apply: "
                               f"{str(err).removesuffix(f' in expression {rule.when!r}')}")
            continue
        if holds:
            return Resolution(from_json_value(rule.value), "policy", rule.reason, needs_human=rule.confirm)
        notes.append(ResolutionStep(key, "policy", "skipped", f"rule {index}: condition {rule.when!r} does not hold"))
    ranked = _by_ranking(conflict, policy.rankings.get(key), notes)
    if ranked is not None and unevaluated:
        # the resolution is what run --json, _mergedConflicts and the summary show: a misspelt rule that
        # left the decision to the ranking is named there, not on the tape alone
        return dataclasses.replace(ranked, reason=f"{ranked.reason}; {'; '.join(unevaluated)}")
    return ranked


def _by_ranking(conflict: MergedConflict, ranking: list[Any] | None, notes: list[ResolutionStep]) -> Resolution | None:
    if not ranking:
        return None
    key = conflict.key
    ranked = [from_json_value(v) for v in ranking]
    positions = {}
    for branch, value in conflict.conflicting_values.items():
        pos = next((i for i, r in enumerate(ranked) if same_value(r, value)), None)
        if pos is None:
            notes.append(ResolutionStep(key, "policy", "skipped",
                                        f"ranking {ranking} does not rank {_show(value)} (branch {branch!r})"))
            return None
        positions[branch] = pos
    best = min(positions, key=positions.__getitem__)
    value = conflict.conflicting_values[best]
    others = sorted({_show(v) for v in conflict.conflicting_values.values() if not same_value(v, value)})
    return Resolution(value, "policy", f"policy ranking for {key!r}: {_show(value)} ranks above {', '.join(others)}")


def _related(conflict: MergedConflict, policy: ConflictPolicy | None, variables: Mapping[str, Any],
             related: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if policy is not None:
        for rule in policy.rules:
            if fnmatch.fnmatchcase(conflict.key, rule.key):
                for name in expression_names(rule.when):
                    if name in variables and not name.startswith("_"):
                        out.setdefault(name, variables[name])
    out.update(related or {})
    return out


def _kept_from_model(conflict: MergedConflict, setting: RedactSetting) -> str | None:
    """Why the model is not asked about ``conflict`` (the join's ``redact`` config hides its
    values: the key is named like a secret, or a value holds one), or None. The model's
    answer is a value to write: shown ``[REDACTED]`` in place of a value, it could only
    write that back, so the conflict goes to the policy's suggestion or a person instead."""
    if setting is False:
        return None
    if secret_key(conflict.key, setting):
        return (f"the key {conflict.key!r} is named like a secret (the join's redact config): its values "
                "are not shown to the model, so a person decides")
    for value in (conflict.base_value, *conflict.conflicting_values.values()):
        if value is DELETED:
            continue
        shown = jsonable(value)
        if redact_for_model(shown, setting) != shown:
            return (f"a value of {conflict.key!r} holds a secret (the join's redact config): its values are "
                    "not shown to the model, so a person decides")
    return None


def _redacted(request: ArbitrationRequest, setting: RedactSetting) -> ArbitrationRequest:
    """The conflict prompt's context as the model may see it (its values passed ``_kept_from_model``)."""
    if setting is False:
        return request
    return dataclasses.replace(
        request, related=redact_for_model(dict(request.related), setting),
        reasons={b: None if r is None else redact_text(r, setting) for b, r in request.reasons.items()},
        policy_text=None if request.policy_text is None else redact_text(request.policy_text, setting))


def _policy_text(policy: ConflictPolicy | None, variables: Mapping[str, Any]) -> str | None:
    """The company policy the model is shown: the join's ``policyText``, else the
    instance's SYSTEM ``policy`` (where DESIGN.md puts it) when that is text."""
    if policy is not None and policy.policy_text:
        return policy.policy_text
    fallback = variables.get("policy")
    return fallback if isinstance(fallback, str) and fallback.strip() else None


def _merged_entries(conflict: MergedConflict) -> Any:
    """For a conflict on an object whose branches changed different entries: the object with
    every branch's entries (the ``merge`` reducer's result); None otherwise."""
    values = list(conflict.conflicting_values.values())
    if not all(isinstance(v, Mapping) for v in values) or not (
            conflict.base_value is DELETED or isinstance(conflict.base_value, Mapping)):
        return None
    try:
        return reduce_values("merge", conflict.key, conflict.base_value, conflict.conflicting_values)
    except ReducerError:
        return None


def default_fits(default: Any, conflict: MergedConflict, suggestion: Resolution | None = None) -> bool:
    """Whether a join's ``humanConfirm.default`` fits ``conflict``: it is of the JSON type of a
    value a branch wrote or of the suggestion (text for a conflict on text, a number for one
    on numbers). A join has one default for all its conflicts (a key listed in
    ``humanConfirm.defaults`` has its own instead, ``default_for``, judged the same way); where it does not fit (the
    join's ``needs_review`` on a conflict over a score) it is neither offered nor what the
    timeout gives, which then falls back as with no default. ``$escalate`` fits every one, and
    so does a deletion (``{"$deleted": true}``): neither is a value of a type. The same test
    chooses which ``humanConfirm.options`` / ``extraOptions`` a conflict is offered."""
    if default == ESCALATE or from_json_value(default) is DELETED:
        return True
    return json_type(default) in _forms(conflict, suggestion)


def _forms(conflict: MergedConflict, suggestion: Resolution | None) -> set[str]:
    """The JSON types of the values a conflict is about: the branches' and the suggestion's."""
    forms = {json_type(v) for v in conflict.conflicting_values.values() if v is not DELETED}
    if suggestion is not None and suggestion.value is not DELETED:
        forms.add(json_type(suggestion.value))
    return forms


def default_for(config: ActivityExtensionConfig, key: str) -> Any:
    """The configured default for a conflict on ``key``: the join's ``humanConfirm.defaults[key]``
    when it lists the key, else its one ``humanConfirm.default`` (None when neither is set).
    Whether it is offered and taken still depends on ``default_fits``."""
    hc = config.human_confirm
    if hc is None:
        return None
    return hc.defaults[key] if key in hc.defaults else hc.default


def _config_options(config: ActivityExtensionConfig) -> list[dict[str, Any]]:
    """The join's ``humanConfirm.options`` then ``extraOptions``, each as ``{label, value}``."""
    hc = config.human_confirm
    out = []
    for extra in [*(hc.options if hc else ()), *(hc.extra_options if hc else ())]:
        if not (isinstance(extra, Mapping) and "value" in extra):
            extra = {"value": extra}
        out.append({"label": str(extra.get("label", _show(extra["value"]))), "value": jsonable(extra["value"])})
    return out


def build_human_request(
    conflict: MergedConflict,
    *,
    gateway_id: str,
    config: ActivityExtensionConfig,
    reasons: Mapping[str, str | None] | None = None,
    suggestion: Resolution | None = None,
) -> HumanRequest:
    """Options: each distinct branch value (labelled with its branches), the policy or
    model suggestion if it is none of them, the config's extra options, its default where it
    fits (``default_fits``), escalate. On timeout: that default, else the suggestion, else
    escalation."""
    reasons = reasons or {}
    options: list[dict[str, Any]] = []
    groups: list[tuple[Any, list[str]]] = []
    for branch, value in conflict.conflicting_values.items():
        for v, branches in groups:
            if same_value(v, value):
                branches.append(branch)
                break
        else:
            groups.append((value, [branch]))
    configured_options = _config_options(config)

    def named(value: Any) -> str:
        """``NAME: `` of the config's option for ``value`` when it gives one (``Read only`` for "read")."""
        return next((f"{o['label']}: " for o in configured_options
                     if same_value(o["value"], value) and o["label"] != _show(o["value"])), "")

    suggested_is_option = False
    for value, branches in groups:
        label = f"{named(value)}{_show(value)} (from {', '.join(branches)})"
        if suggestion is not None and same_value(value, suggestion.value):
            label += f", suggested by {suggestion.resolver}"
            suggested_is_option = True
        options.append({"label": label, "value": jsonable(value)})
    if suggestion is not None and not suggested_is_option:
        options.append({"label": f"{named(suggestion.value)}{_show(suggestion.value)} (suggested by "
                                 f"{suggestion.resolver}: {suggestion.reason})",
                        "value": jsonable(suggestion.value)})
    merged = _merged_entries(conflict)
    if merged is not None and not any(same_value(o["value"], merged) for o in options):
        options.append({"label": f"{_show(merged)} (every branch's entries merged)", "value": jsonable(merged)})
    hc = config.human_confirm
    for extra in configured_options:
        if any(same_value(o["value"], extra["value"]) for o in options):
            continue  # offered already (a branch's value or the suggestion)
        if not default_fits(extra["value"], conflict, suggestion):
            continue  # a join's options serve all its conflicts: a text is no answer for a score
        options.append(extra)
    # The configured default is what the timeout gives, so a person may choose it too; were it
    # missing from the options it could never be an answer, and the timeout would escalate instead.
    configured = default_for(config, conflict.key)
    fits = configured is not None and default_fits(configured, conflict, suggestion)
    if (fits and configured != ESCALATE
            and not any(same_value(o["value"], configured) for o in options)):
        options.append({"label": f"{_show(configured)} (the default when nobody answers)",
                        "value": jsonable(configured)})
    if not any(o["value"] == ESCALATE for o in options):  # the config may offer it under a label of its own
        options.append({"label": "escalate (stop the instance for an administrator)", "value": ESCALATE})

    wants = "; ".join(f"{b} wants {_show(v)}" + (f" because {reasons[b]!r}" if reasons.get(b) else "")
                      for b, v in conflict.conflicting_values.items())
    before = "not set before the split" if conflict.base_value is DELETED else f"was {_show(conflict.base_value)}"
    message = f"Parallel branches of {gateway_id!r} disagree on {conflict.key!r} ({before}): {wants}."
    if suggestion is not None:
        message += f" The {suggestion.resolver} suggests {_show(suggestion.value)}: {_sentence(suggestion.reason)}"
    if merged is not None:
        message += (f" The branches changed different entries of the object: the merged object is offered too "
                    f"(reducers: {{{conflict.key}: merge}} in the join's config merges them without asking).")
    message += " Which value should the process continue with?"
    if hc is not None and hc.message and hc.message.strip():
        message = f"{_sentence(hc.message)} {message}"

    default_by: str | None
    if fits and hc is not None:
        default, on_timeout, default_by = configured, hc.on_timeout, "config"
    elif suggestion is not None:
        default, on_timeout = jsonable(suggestion.value), (hc.on_timeout if hc else "default")
        default_by = suggestion.resolver
    else:
        default, on_timeout, default_by = None, "escalate", None
    return HumanRequest(
        id=f"{gateway_id}/{conflict.key}", message=message, options=options,
        timeout=hc.timeout if hc else 300.0, default=default, on_timeout=on_timeout,
        gateway_id=gateway_id, key=conflict.key,
        suggested=None if suggestion is None else suggestion.value,
        suggested_by=None if suggestion is None else suggestion.resolver,
        suggested_reason=None if suggestion is None else suggestion.reason,
        default_by=default_by,
    )


def _matchers(answer: Any) -> tuple[Callable[[Mapping[str, Any]], bool], ...]:
    """The ways ``answer`` picks an option, in order: by value, by label, by the value's JSON text."""
    return (lambda o: bool(same_value(o["value"], answer)),
            lambda o: isinstance(answer, str) and answer == o["label"],
            lambda o: isinstance(answer, str) and answer == json.dumps(o["value"], ensure_ascii=False))


def _picks(option: Mapping[str, Any], answer: Any) -> bool:
    return any(matches(option) for matches in _matchers(answer))


def match_answer(request: HumanRequest, answer: Any) -> dict[str, Any]:
    """The option ``answer`` picks: by value, by label, or by the value's JSON text (a
    CLI ``--answer KEY=VALUE`` is a string). Raises ``InvalidAnswerError``."""
    def escalates(o: Mapping[str, Any]) -> bool:  # the word, as a CLI answer gives it
        return bool(answer == "escalate" and o["value"] == ESCALATE)

    for matches in (*_matchers(answer), escalates):
        for option in request.options:
            if matches(option):
                return option
    offered = ", ".join(_show(o["value"]) for o in request.options)
    raise InvalidAnswerError(f"answer {_show(answer)} for confirmation {request.id!r} is not one of the offered "
                             f"option values: {offered}")


def unfit_option(request: HumanRequest, answer: Any, config: ActivityExtensionConfig) -> str | None:
    """Why ``answer`` is refused when it picks (by value, label or JSON text) one of the join's
    configured ``humanConfirm`` options that ``request`` was not offered, as of another JSON type
    than the conflict's values; None when it picks none of them. A typo gets the plain message of
    ``match_answer``; this one says that the option exists but cannot be this key's value."""
    if any(_picks(o, answer) for o in request.options):
        return None
    forms = {json_type(from_json_value(o["value"])) for o in request.options
             if o["value"] != ESCALATE and from_json_value(o["value"]) is not DELETED}
    for option in _config_options(config):
        if _picks(option, answer) and json_type(option["value"]) not in forms:
            offered = ", ".join(_show(o["value"]) for o in request.options)
            return (f"answer {_show(answer)} for confirmation {request.id!r} picks humanConfirm option "
                    f"{_show(option['value'])} of join {request.gateway_id!r}, a {json_type(option['value'])}, and "
                    f"the conflict on key {request.key!r} is over {' and '.join(sorted(forms))} values: an option of "
                    f"another type is not offered for it (it could not be the key's value). Answer with one of: "
                    f"{offered}")
    return None


def _match_for(request: HumanRequest, answer: Any, config: ActivityExtensionConfig) -> dict[str, Any]:
    """``match_answer``, refusing an unfit configured option as such (``unfit_option``)."""
    try:
        return match_answer(request, answer)
    except InvalidAnswerError:
        why = unfit_option(request, answer, config)
        if why is None:
            raise
        raise InvalidAnswerError(why) from None


def _unreachable(err: BaseException) -> bool:
    """Whether the model could not be reached: the arbiter's error says so (``unreachable``, as
    ``engine.llm``'s ``ModelCallFailed`` does once its retries are spent on a transport failure), or
    is itself a refused connection or a timeout."""
    return bool(getattr(err, "unreachable", False)) or isinstance(err, (ConnectionError, TimeoutError))


def _model_values(conflict: MergedConflict, config: ActivityExtensionConfig) -> list[Any]:
    """The values ``conflict`` is about, whose JSON types the model's value must have one of: those a
    person would be offered (the branches' values, the merged object, the join's fitting ``humanConfirm``
    options and default), the values the join's ``conflictPolicy`` gives the key (its rules' and its
    ranking's) and the value before the split. (A value of such a type that none of them is, a
    compromise such as ``medium`` between ``low`` and ``high``, is the model's to choose; the steps'
    ``outputSchema`` bounds it, ``engine.llm.LiteLLMArbiter``.)"""
    offered = build_human_request(conflict, gateway_id="", config=config).options
    values = [from_json_value(o["value"]) for o in offered if o["value"] != ESCALATE]
    policy = config.conflict_policy
    if policy is not None:
        values += [from_json_value(r.value) for r in policy.rules if fnmatch.fnmatchcase(conflict.key, r.key)]
        values += [from_json_value(v) for v in policy.rankings.get(conflict.key, ())]
    if conflict.base_value is not DELETED:
        values.append(conflict.base_value)
    return [v for i, v in enumerate(values) if not any(same_value(v, w) for w in values[:i])]


def _mistyped(value: Any, allowed: Sequence[Any], key: str) -> str | None:
    """Why ``value`` cannot be the value of ``key`` at all (a JSON type none of ``allowed`` has: the
    text ``"1200"`` for a payout the branches gave as numbers), or None. Such a value is a malformed
    answer, not a suggestion: a person offered it, or a timeout taking it, would write the wrong type."""
    forms = sorted({json_type(v) for v in allowed if v is not DELETED})
    if value is DELETED or not forms or json_type(value) in forms:
        return None
    shown = ", ".join(_show(v) for v in allowed if v is not DELETED)
    return (f"final_value {_show(value)} is a {json_type(value)}, and the values of {key!r} are of JSON type "
            f"{' or '.join(forms)} ({shown}): answer with one of them, written as JSON of that type")


def _ask_model(arbiter: ConflictArbiter, request: ArbitrationRequest, steps: list[ResolutionStep], *,
               allowed: Sequence[Any] = ()) -> tuple[Resolution | None, str | None]:
    """The model's resolution (``needs_human`` when it escalates), or ``None`` when it failed; and, when
    the model could not be reached at all, what the failure was (the join then asks it no more). A
    malformed answer (one of a JSON type none of ``allowed`` has included) is asked again once, the model
    shown its reply and what was wrong."""
    key = request.key
    for attempt in (1, 2):
        try:
            answer = arbiter.arbitrate(request)
            if not isinstance(answer, ArbitrationAnswer):  # an arbiter of the application's own, wrongly typed
                raise ArbiterAnswerError(f"{type(arbiter).__name__}.arbitrate() returned a {type(answer).__name__}, "
                                         "not a gateways.ArbitrationAnswer", text=repr(answer))
            value = from_json_value(answer.final_value)
            mistyped = _mistyped(value, allowed, key)
            if mistyped is not None:
                raise ArbiterAnswerError(mistyped, text=json.dumps(answer.model_dump(), ensure_ascii=False))
        except ArbiterAnswerError as err:
            steps.append(ResolutionStep(key, "model", "failed", f"attempt {attempt}: {err}"))
            request = request.corrected(err.text, err.problem)
            continue
        except Exception as err:  # any model failure falls through to a person; the step says why
            steps.append(ResolutionStep(key, "model", "failed", f"{type(err).__name__}: {err}"))
            return None, f"{type(err).__name__}: {err}" if _unreachable(err) else None
        if answer.escalate:
            steps.append(ResolutionStep(key, "model", "escalated", f"{_show(value)}: {answer.rationale}"))
            return Resolution(value, "model", answer.rationale, needs_human=True), None
        steps.append(ResolutionStep(key, "model", "resolved", answer.rationale))
        return Resolution(value, "model", answer.rationale), None
    return None, None


def _taken_unattended(request: HumanRequest, value: Any, actor: Any) -> str:
    """The reason of an answer no person gave (an unattended run such as ``layerflow --yes`` took what
    was proposed at the ``human_confirm`` step): whose proposal it took, the suggestion's (``policy`` or
    ``model``) or the configured default, and that nobody was asked. The resolver stays ``human``, the
    step that settled it (the operator who gave ``--yes`` accepted the proposals in advance, as an
    answers file answers in advance); the reason and the tape's ``unattended`` note say that no person
    saw the value."""
    who = actor if isinstance(actor, str) and actor else "an unattended run"
    suggestion = request.suggestion
    if suggestion is not None and same_value(value, suggestion.value):
        return (f"{who} took the {suggestion.resolver}'s suggestion {_show(value)} without asking "
                f"a person: {suggestion.reason}")
    return f"{who} took the configured default {_show(value)} without asking a person"


def _timeout_resolver(request: HumanRequest) -> str:
    """Who settled a conflict whose confirmation timed out with its default taken: not a person. The
    suggestion's resolver when it stood in for a default (``default_by``), else ``policy``: the join's
    configured ``humanConfirm`` default is the process's rule for an unanswered question."""
    return request.default_by if request.default_by in ("policy", "model") else "policy"


def _answer_reason(request: HumanRequest, option: Mapping[str, Any], value: Any, *, timed_out: bool,
                   resolver: str = "human", person: str | None = None) -> str:
    suggestion = request.suggestion
    if timed_out:
        suggested = suggestion is not None and same_value(value, suggestion.value)
        if suggestion is not None and suggested and request.default_by == suggestion.resolver:
            # no default configured: the suggestion stood in for it, and the reason says whose it was
            return (f"no answer within {request.timeout:g}s, nobody answered: the timeout took the "
                    f"{suggestion.resolver}'s suggestion {_show(value)} (no default configured): {suggestion.reason}")
        reason = (f"no answer within {request.timeout:g}s, nobody answered: the timeout took the configured default "
                  f"{_show(value)}")
        if suggestion is not None and suggested:
            reason += f" (the {suggestion.resolver} suggestion: {suggestion.reason})"
        return reason
    who = "the model" if resolver == "model" else f"a person ({person})" if person else "a person"
    if suggestion is not None and same_value(value, suggestion.value):
        return f"{who} confirmed the {suggestion.resolver} suggestion: {suggestion.reason}"
    return f"{who} chose {option['label']}"


def resolve_conflicts(
    conflicts: Sequence[MergedConflict],
    *,
    config: ActivityExtensionConfig,
    variables: Mapping[str, Any],
    gateway_id: str,
    arbiter: ConflictArbiter | None = None,
    answers: Mapping[str, Any] | None = None,
    human_available: bool = False,
    reasons: Mapping[str, str | None] | None = None,
    related: Mapping[str, Any] | None = None,
    arrival_order: Sequence[str] = (),
    asked: Mapping[str, Mapping[str, Any]] | None = None,
    decided: Mapping[str, Mapping[str, Any]] | None = None,
) -> ResolutionOutcome:
    """Settle ``conflicts`` per the join's ``mergeStrategy`` (see the module doc).
    ``reasons``: branch -> its stated reason; ``related``: extra context for the model;
    ``asked``: confirmation id -> the request a person was shown (``HumanRequest.to_dict``,
    plus ``timed_out`` when the answer was a timeout's); ``decided``: key -> what the model
    settled when this join ran before, waiting for people (``{"values": {branch: value},
    "resolution": {"value", "reason"}}``): a join that runs again once they answered keeps the
    model's decisions of the same conflicts instead of asking it again (it may answer otherwise,
    and a run that reported a decision must not change it behind the reader's back)."""
    if config.merge_strategy != "MERGE_WITH_CONFLICT_DETECT":
        pairs = resolve_by_strategy(conflicts, config, arrival_order=arrival_order, gateway_id=gateway_id)
        return ResolutionOutcome(pairs, [], [ResolutionStep(c.key, "strategy", "resolved", r.reason) for c, r in pairs])
    answers = answers or {}
    resolved: list[tuple[MergedConflict, Resolution]] = []
    pending: list[HumanRequest] = []
    steps: list[ResolutionStep] = []
    unresolved: list[MergedConflict] = []
    escalated: list[MergedConflict] = []
    secret_keys: list[str] = []  # conflicts kept from the model (_kept_from_model)
    down: str | None = None  # the model could not be reached for an earlier key: why it is not asked again
    policy = config.conflict_policy
    for conflict in conflicts:
        key = conflict.key
        suggestion: Resolution | None = None
        prior = (asked or {}).get(f"{gateway_id}/{key}")
        if prior is not None and f"{gateway_id}/{key}" in answers:
            shown = HumanRequest.from_dict(prior)
            picked = _match_for(shown, answers[shown.id], config)
            # who answered: a person, or a model settling it with its context_branch tool
            by = "model" if prior.get("resolver") == "model" else "human"
            if picked["value"] == ESCALATE:
                # The answer is final, so it never settles the conflict; what an administrator
                # changed since (a conflictPolicy rule or ranking that needs no person, given as
                # runtime config) does, on the next resume. Before that, the policy either did
                # not settle the conflict or asked a person: that is why one was asked.
                settled = resolve_by_policy(conflict, policy, variables) if policy is not None else None
                if settled is not None and not settled.needs_human:
                    reason = f"{settled.reason} (after {shown.id!r} was escalated)"
                    steps.append(ResolutionStep(key, "policy", "resolved", reason))
                    resolved.append((conflict, Resolution(settled.value, "policy", reason)))
                    continue
                steps.append(ResolutionStep(key, by, "escalated", f"answer for {shown.id!r}"))
                escalated.append(conflict)
                continue
            value = from_json_value(picked["value"])
            if prior.get("unattended"):
                reason = _taken_unattended(shown, value, prior.get("answered_by"))
                steps.append(ResolutionStep(key, "human", "answered", reason))
                resolved.append((conflict, Resolution(value, "human", reason)))
                continue
            timed_out = bool(prior.get("timed_out"))
            if timed_out:
                # nobody decided: the join's config did (its humanConfirm default), or the suggestion
                # that stood in for a default
                by = _timeout_resolver(shown)
            name = prior.get("by") if by == "human" else None
            name = name if isinstance(name, str) and name.strip() else None
            reason = _answer_reason(shown, picked, value, timed_out=timed_out, resolver=by, person=name)
            stated = prior.get("reason")  # what the person gave as their reason (REST resolve, console)
            if isinstance(stated, str) and stated.strip():
                reason = f"{reason}: {stated.strip()}"
            steps.append(ResolutionStep(key, by, "timed_out" if timed_out else "answered", reason))
            resolved.append((conflict, Resolution(value, by, reason, by=name)))
            continue
        if policy is not None:
            found = resolve_by_policy(conflict, policy, variables, steps=steps)
            if found is not None and not found.needs_human:
                steps.append(ResolutionStep(key, "policy", "resolved", found.reason))
                resolved.append((conflict, found))
                continue
            if found is not None:
                steps.append(ResolutionStep(key, "policy", "suggested", f"{_show(found.value)}: {found.reason}; "
                                            "the rule asks a person to confirm"))
                suggestion = found
        earlier = (decided or {}).get(key)
        # kept with or without a model now: the person answering later may resume with none configured
        if suggestion is None and earlier is not None and json.dumps(
                earlier.get("values"), sort_keys=True) == json.dumps(
                {b: jsonable(v) for b, v in conflict.conflicting_values.items()}, sort_keys=True):
            reason = f"{earlier['resolution'].get('reason') or 'the model decided'} (decided when the join first ran)"
            steps.append(ResolutionStep(key, "model", "resolved", reason))
            resolved.append((conflict, Resolution(from_json_value(earlier["resolution"]["value"]), "model", reason)))
            continue
        secret = _kept_from_model(conflict, config.redact) if suggestion is None and arbiter is not None else None
        if secret is not None:
            steps.append(ResolutionStep(key, "model", "skipped", secret))
            secret_keys.append(key)
        elif suggestion is None and arbiter is not None and down is not None:
            steps.append(ResolutionStep(key, "model", "skipped", down))
        elif suggestion is None and arbiter is not None:
            request = ArbitrationRequest(
                gateway_id=gateway_id, key=key, base_value=conflict.base_value, values=conflict.conflicting_values,
                reasons={b: (reasons or {}).get(b) for b in conflict.source_branches},
                related=_related(conflict, policy, variables, related),
                policy_text=_policy_text(policy, variables),
                layer=None if conflict.layer is None else str(conflict.layer))
            found, failure = _ask_model(arbiter, _redacted(request, config.redact), steps,
                                         allowed=_model_values(conflict, config))
            if failure is not None:
                # every retry of the client is spent on each key in turn otherwise, for the same outage
                down = (f"{MODEL_NOT_ASKED} for {key!r} at this join ({failure}), so it is asked no more for "
                        "this join's conflicts")
            if found is not None and not found.needs_human:
                resolved.append((conflict, found))
                continue
            suggestion = found
        request_h = build_human_request(conflict, gateway_id=gateway_id, config=config, reasons=reasons,
                                        suggestion=suggestion)
        given = answers.get(request_h.id, DELETED)
        option = None
        if given is not DELETED:
            option = _match_for(request_h, given, config)
        elif "*" in answers:
            try:
                option = match_answer(request_h, answers["*"])
            except InvalidAnswerError:
                option = None
        if option is not None:
            if option["value"] == ESCALATE:
                steps.append(ResolutionStep(key, "human", "escalated", f"answer for {request_h.id!r}"))
                escalated.append(conflict)
                continue
            value = from_json_value(option["value"])
            reason = _answer_reason(request_h, option, value, timed_out=False)
            steps.append(ResolutionStep(key, "human", "answered", reason))
            resolved.append((conflict, Resolution(value, "human", reason)))
        elif human_available:
            steps.append(ResolutionStep(key, "human", "pending", f"waiting for confirmation {request_h.id!r}"))
            pending.append(request_h)
        else:
            unresolved.append(conflict)
    if unresolved or escalated:
        parts = []
        if unresolved:
            missing = ["no conflictPolicy ranking or rule settled it" if policy else "no conflictPolicy is configured",
                       ("no model answered" if not all(c.key in secret_keys for c in unresolved)
                        else "the model is not shown secrets (redact)") if arbiter else "no model is configured",
                       "no person can be asked (no answer given)"]
            parts.append(f"unresolved ({', '.join(missing)}): {', '.join(repr(c.key) for c in unresolved)}")
        if escalated:
            parts.append(f"escalated by a person: {', '.join(repr(c.key) for c in escalated)}")
        todo = ("Add a conflictPolicy rule, configure a model, answer the confirmation "
                f"(--answer {gateway_id}/KEY=VALUE), or choose another mergeStrategy.") if unresolved else ""
        if unresolved and config.branch_priority:
            # branchPriority alone looks like a choice made; it is read by BRANCH_PRIORITY only
            todo += (f" branchPriority {list(config.branch_priority)} is set but mergeStrategy is "
                     f"{config.merge_strategy}: write mergeStrategy: BRANCH_PRIORITY to let it decide.")
        if escalated:
            todo += (" " if todo else "") + f"{ESCALATION_IS_FINAL} (`layerflow resume ID`)."
            # without a server (the CLI on a sqlite file), a branch's own value corrected so the branches
            # agree settles it too: the join merges its branches again
            key = escalated[0].key if len({c.key for c in escalated}) == 1 else "KEY"
            branches = ", ".join(dict.fromkeys(b for c in escalated for b in c.conflicting_values))
            todo += (f" Or correct a branch's own value so the branches agree: `layerflow resume ID --set "
                     f"{key}=VALUE --context BRANCH_ID` (the branches: {branches}).")
        err = conflict_error([*unresolved, *escalated], gateway_id=gateway_id, why="; ".join(parts), todo=todo)
        err.steps = [s.to_dict() for s in steps]  # type: ignore[attr-defined]
        raise err
    return ResolutionOutcome(resolved, pending, steps)
