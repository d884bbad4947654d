"""Data flow between the calls of one step: which call's output fed which call's input.

Recorded flow comes from ``CallNode.inputs_from`` (fx graph edges where a module was traced, tensor identity where it
was captured eagerly). Tensor identity loses the thread wherever a module's input was computed by plain tensor code
between module calls (``o_proj`` receives the attention context, not ``q_proj``'s output; a residual add makes a new
tensor), which would leave such calls unconnected. Those gaps are bridged by *inferred* flow, derived from call order
alone: a call that received tensors but no recorded output was computed from the outputs of its earlier siblings that
no call received (``q_proj``, ``k_proj``, ``v_proj`` -> ``o_proj``), of a dtype it received: code between calls does
not turn activations into the integers an embedding is given (GPT-2's ``wte`` does not feed ``wpe``, whose positions
come from the input). Inferred flow is marked as such, never mixed up with recorded flow.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphtrace.model import CallNode

__all__ = ["Flow", "data_flow"]


@dataclass(frozen=True, slots=True)
class Flow:
    """The output of call ``producer`` reached call ``consumer`` (ids ``path@index``); ``inferred`` when derived from
    call order rather than recorded."""

    producer: str
    consumer: str
    inferred: bool = False


def data_flow(step: CallNode) -> list[Flow]:
    """Every recorded flow into the calls of ``step``, then the inferred ones, in call order."""
    ids = {node.id for node in step.walk()}
    recorded = [
        Flow(producer, node.id)
        for node in step.walk()
        for producer in node.inputs_from
        if producer in ids and producer != node.id
    ]
    received = {flow.producer for flow in recorded}
    inferred: list[Flow] = []
    for parent in step.walk():
        unreceived: dict[str, set[str]] = {}  # earlier siblings whose outputs no call received so far: their dtypes
        for child in parent.children:
            given = {record.dtype for _, record in child.input_tensors()}
            if not child.inputs_from and given:
                # outputs not recorded (transformers' files keep only leaves'): their dtypes are unknown
                feeding = [producer for producer, dtypes in unreceived.items() if not dtypes or dtypes & given]
                inferred += (Flow(producer, child.id, inferred=True) for producer in feeding)
                unreceived = {producer: unreceived[producer] for producer in unreceived if producer not in feeding}
            if child.id not in received:
                unreceived[child.id] = {record.dtype for _, record in child.output_tensors()}
    return recorded + inferred
