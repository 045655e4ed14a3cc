"""How much of a call's prompt the engines likely hold cached, as admission estimates it.

Admission predicts prefill before routing, without the prefix index's match (the gateway
passes no cached count), so it priced every prompt as uncached. An agent's step resends
its whole conversation: on the peers' agentic workload a step carries ~1,900 prompt
tokens of which ~100 are new, so the queue's drain estimate (queued prompt tokens at the
pool's prefill rate) read ~8x the prefill the engines actually ran, and admission refused
calls as "deadline unreachable" that the fleet would have served in time.

A workflow's next step extends the conversation its previous step sent (the reply
appended), and workflow affinity routes it to the engine that served that step. So the
estimate: a call of a known workflow has cached the previous step's prompt plus its
output budget, capped by its own prompt. Calls without a workflow id get no credit.
Workflows are keyed by tenant and id, so one tenant's ids never move another's estimate.
Bounded: the oldest workflows are forgotten first. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict

from inferplane.core.types import CallContext

__all__ = ["ConversationReuse"]


class ConversationReuse:
    """Per workflow, the context its last admitted step leaves cached (module docstring)."""

    def __init__(self, max_workflows: int = 100_000) -> None:
        self._max = max(1, max_workflows)
        self._context: OrderedDict[tuple[str, str], int] = OrderedDict()

    def cached_tokens(self, call: CallContext) -> int:
        """Prompt tokens of ``call`` likely cached: its workflow's previous context."""
        if call.workflow_id is None:
            return 0
        return min(call.num_prompt_tokens, self._context.get((call.tenant, call.workflow_id), 0))

    def note(self, call: CallContext) -> None:
        """``call`` was admitted or queued: its prompt and reply become the next step's prefix."""
        if call.workflow_id is None:
            return
        key = (call.tenant, call.workflow_id)
        self._context[key] = call.num_prompt_tokens + max(0, call.max_tokens)
        self._context.move_to_end(key)
        while len(self._context) > self._max:
            self._context.popitem(last=False)

    def __len__(self) -> int:
        return len(self._context)
