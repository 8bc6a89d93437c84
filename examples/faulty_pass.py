"""A deliberately wrong rewrite, to show `graphkernel bisect` at work.

    graphkernel bisect examples/mlp_gelu.json --plugin examples/faulty_pass.py

It registers ``swap_add_sub`` (simplify stage, level 2), which turns the 2nd Add it sees into
a Sub, as a buggy optimization would. Do not use it for anything else.
"""

from graphkernel.registry import PassResult, register_pass


@register_pass("swap_add_sub", stage="simplify", level=2, order=35)
def swap_add_sub(graph, ctx):
    """Rewrite the 2nd Add(a, b) -> Sub(a, b) (wrong on purpose)."""
    seen = 0
    for node in graph.nodes:
        if node.op != "Add":
            continue
        seen += 1
        if not ctx.should_apply(f"{node.name} (Add -> Sub)", [node]):
            continue
        if seen == 2:
            sub = graph.add_node("Sub", list(node.inputs), name=graph.fresh_name(node.name),
                                 origin=node.origin)
            graph.replace_all_uses(node.output, sub.output)
            graph.erase_node(node)
            return PassResult(True, 1)
    return PassResult(False, 0)
