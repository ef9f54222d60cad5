"""Link the JAX names the pages write as code to JAX's API documentation.

Pages and docstrings write JAX's names as inline code (`jax.jit`,
`jax.sharding.Mesh`, `jax.Array.sum`). `sphinx.ext.intersphinx` reads JAX's
inventory from the committed `_intersphinx/jax.inv` (no network; see
`_intersphinx/make_jax_inventory.py`), so explicit references such as
``:class:`jax.sharding.Mesh``` resolve; this extension also makes each piece
of inline code that is exactly a name of that inventory (optionally followed
by `()`) a link to its page there. Code in headings, code that is already a
link and code blocks stay as they are.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.ext.intersphinx import InventoryAdapter

INVENTORY = "jax"


def jax_names(env) -> dict[str, str]:
  """`{name: url}` of every object of JAX's inventory."""
  inventory = InventoryAdapter(env).named_inventory.get(INVENTORY, {})
  return {name: item.uri for objects in inventory.values() for name, item in objects.items()}


def link_literals(doctree: nodes.Node, names: dict[str, str]) -> int:
  """Wrap each inline literal naming one of `names` in a link; return how many."""
  linked = 0
  for literal in list(doctree.findall(nodes.literal)):
    if any(isinstance(a, (nodes.reference, nodes.title, nodes.FixedTextElement))
           for a in _ancestors(literal)):
      continue
    text = literal.astext()
    url = names.get(text.removesuffix("()"))
    if url is None:
      continue
    link = nodes.reference("", "", internal=False, refuri=url,
                           reftitle=f"{text.removesuffix('()')} (JAX's API documentation)")
    literal.replace_self(link)
    link += literal
    linked += 1
  return linked


def _ancestors(node: nodes.Node):
  node = node.parent
  while node is not None:
    yield node
    node = node.parent


def _resolved(app, doctree, docname) -> None:
  link_literals(doctree, jax_names(app.env))


def setup(app):
  app.connect("doctree-resolved", _resolved)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
