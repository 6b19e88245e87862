"""The sync hook as one pipeline: a parsed Metacontroller request in, the answer out.

request -> typed graph -> rollout -> observed inputs -> desired children -> answer -> status.
Each step is a pure function of plain data; the memo wraps the expensive ones from outside
(parsing, rendering, reading the observed children's records, rolling up), so a step never
knows whether it was kept.
"""

import json
import logging
from typing import Any

from hooks import answer, render, rollout, status
from hooks.answer import SyncAnswer
from hooks.api.fields import SpecError
from hooks.api.status import Clock, utc_now
from hooks.contract import HookRequest
from hooks.memo import RenderMemo

log = logging.getLogger(__name__)


def sync(request: HookRequest, now: Clock = utc_now) -> dict[str, Any]:
    """The sync answer as plain data, computed afresh (the CLI, the tests)."""
    return json.loads(sync_answer(request, now).json())


def sync_answer(request: HookRequest, now: Clock = utc_now, memo: RenderMemo | None = None) -> SyncAnswer:
    """The desired children and status. With a memo, what was computed for the same parent and
    inputs before is not computed again."""
    memo = memo or RenderMemo(0)
    try:
        # 1. The typed graph, parsed once per spec: a spec that does not parse fails here.
        entry = memo.parent(request.parent)
        idep = entry.idep()
        registered, observed = request.registered, request.by_key
        # 2. Which generations to answer. Under BlueGreen the spec's generation is a digest of
        #    a render, and an observed generation of another name is compared with the spec
        #    rendered at it.
        spec_digest = (
            memo.remembered(entry, rollout.spec_generation, idep, registered)
            if idep.spec.blue_green or rollout.leaving_blue_green(idep, observed)
            else ""
        )
        compared = {
            generation: memo.remembered(entry, rollout.workloads_at, idep, registered, generation)
            for generation in rollout.compared_generations(idep, observed, spec_digest)
        }
        plan = rollout.plan(idep, observed, status.previous_status(request), spec_digest, compared)
        idep = idep.at_generation(plan.desired if plan else "")
        # 3. What the render reads of the observed children (an autoscaler's count, the download).
        inputs = render.RenderInputs.of(idep, observed, plan)
        # 4. The desired children, rendered, checked and encoded; the defaults they leave out.
        desired, left_out = memo.remembered(entry, render.desired_children, idep, registered, inputs)
        # 5. What the rollout keeps beside them: the generations still served, as applied, and
        #    what the serving generation lost that the spec makes as it recorded.
        kept = rollout.kept_generations(request, plan)
        restoration = rollout.restoration_needed(plan, observed, idep)
        restored, lost = (
            memo.remembered(entry, rollout.restored_children, restoration, idep, registered, plan)
            if restoration and plan
            else ([], [])
        )
        # 6. The answer: less what the controller cannot create, with what cannot change as
        #    stored (and whether the hook applied it, as the observed children's records say).
        recorded = memo.remembered(entry, answer.recorded_fields, answer.records_to_read(request.children))
        answered = answer.answered(request, [*desired, *kept, *restored], recorded)
        # 7. The status's inputs: what was observed, what this answer does (which services it
        #    changes beyond their replicas, against the records), what it could not.
        workloads = answer.workloads_answered(idep, answered.children, observed)
        read = status.inputs_of(
            idep,
            request,
            answered.children,
            plan,
            inputs.live_replicas,
            notices=[*answered.notices, *left_out],
            unregistered=answered.unregistered,
            changing=memo.remembered(entry, answer.services_changing, workloads),
            lost=lost,
        )
    except SpecError as error:
        return _keep_observed(request, str(error), now)
    except Exception as error:  # a renderer bug must not delete a running fleet either
        log.exception("rendering %s failed", request.parent["metadata"]["name"])
        # Say what failed, not where: an exception's text can hold file paths and internals.
        message = f"internal error while rendering ({type(error).__name__}); the hook's log has the details"
        return _keep_observed(request, message, now)
    # 8. The status, rolled up (or kept from an equal roll-up that did not read the clock).
    state, status_json = memo.rolled_up(entry, status.encoded_status, idep, read, now=now)
    return SyncAnswer(state, status_json, answered.children)


def _keep_observed(request: HookRequest, message: str, now: Clock) -> SyncAnswer:
    """A bad spec fails loudly in status and keeps every observed child exactly as applied (an
    autoscaled workload at the autoscaler's count), creating nothing new."""
    state, status_json = status.encoded_failure(request, message, now)
    return SyncAnswer(state, status_json, answer.observed_as_applied(request))
