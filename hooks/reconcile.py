"""The sync hook as one pipeline: a parsed Metacontroller request in, the answer out.

request -> typed graph -> rollout -> observed inputs -> desired children -> answer -> status.
Each step is a pure function of plain data; the memo wraps the expensive ones from outside
(parsing, rendering, rolling up), so a step never knows whether it was kept.
"""

import json
import logging
from typing import Any

from hooks import answer, registration, render, rollout, status
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
    registered = request.registered
    observed = request.by_key
    try:
        # 1. The typed graph, parsed once per spec: a spec that does not parse fails here.
        entry = memo.parent(request.parent)
        idep = entry.idep()
        # 2. Which generations to answer. Under BlueGreen the spec's generation is a digest of
        #    a render, and each observed generation is compared with the spec rendered at it.
        compared = rollout.compared_generations(idep, observed)
        spec_digest = (
            memo.remembered(entry, rollout.spec_generation, idep, registered)
            if idep.spec.blue_green or compared
            else ""
        )
        workloads = {g: memo.remembered(entry, rollout.workloads_at, idep, registered, g) for g in compared}
        plan = rollout.plan(idep, observed, status.previous_status(request), spec_digest, workloads)
        idep = idep.at_generation(plan.desired if plan else "")
        # 3. What the render reads of the observed children (an autoscaler's count, the download).
        inputs = render.RenderInputs.of(idep, observed, plan)
        # 4. The desired children, rendered, checked and encoded.
        desired = memo.remembered(entry, render.desired_children, idep, registered, inputs)
        # 5. The children of the serving generation that are gone, where it is not the spec's:
        #    the spec rendered at it says which can be made again as recorded.
        restoration = rollout.restoration(plan, observed, idep)
        rendered_at_serving = (
            memo.remembered(entry, render.render_children, *rollout.render_at(restoration, idep, registered, observed))
            if restoration
            else None
        )
        # 6. The answer: what the rollout keeps or restores beside them, less what the
        #    controller cannot create, with what cannot change as stored.
        answered = answer.children(request, desired, plan, restoration, rendered_at_serving)
        # 7. The defaults the spec leaves out where the controller cannot create them.
        left_out = memo.remembered(entry, registration.defaults_left_out, idep, registered)
    except SpecError as error:
        return _keep_observed(request, str(error), now)
    except Exception as error:  # a renderer bug must not delete a running fleet either
        log.exception("rendering %s failed", request.parent["metadata"]["name"])
        # Say what failed, not where: an exception's text can hold file paths and internals.
        message = f"internal error while rendering ({type(error).__name__}); the hook's log has the details"
        return _keep_observed(request, message, now)
    # 8. The status, from what was observed and what this answer does.
    read = status.inputs_of(idep, request, inputs, answered, plan, left_out)
    state, status_json = memo.rolled_up(entry, status.encoded_status, idep, read, now=now)
    return SyncAnswer(state, status_json, answered.answer)


def _keep_observed(request: HookRequest, message: str, now: Clock) -> SyncAnswer:
    """A bad spec fails loudly in status and keeps every observed child exactly as applied (an
    autoscaled workload at the autoscaler's count), creating nothing new."""
    state, status_json = status.encoded_failure(request, message, now)
    return SyncAnswer(state, status_json, answer.observed_as_applied(request))
