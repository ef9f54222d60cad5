"""One finding of the porting tool, printed as linters print theirs."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
  """`path:line:col: CODE message`; `line` and `col` count from 1.

  Codes: `JSE1xx` an import this package replaces, `JSE2xx` a use whose
  meaning changed, `JSE3xx` a JAX API removed. `fixable` is True when
  `--write` makes the change itself (the message then ends with
  "(--write fixes this)"); the others name the exact change to make.
  In a notebook, `path` is `file.ipynb:cell N` and `line` counts in that cell.

  Attributes:
    path: the file (or `file.ipynb:cell N`, or the name given to `check`).
    line: the line of the finding, from 1.
    col: its column, from 1.
    code: `JSE` and three digits; the first digit is its kind (above).
    message: what changed and what to write instead.
    fixable: whether `--write` (and `fix`) makes the change itself.

  Example:
    >>> (finding,) = jse.port.check("import jax\\njax.tree_map(abs, [1])\\n", "a.py")
    >>> finding.code, finding.line, finding.col, finding.fixable
    ('JSE301', 2, 1, True)
  """
  path: str
  line: int
  col: int
  code: str
  message: str
  fixable: bool = dataclasses.field(default=False, compare=False)

  def __str__(self) -> str:
    return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"


# Shown (and pickled) under the module users import it from.
Finding.__module__ = "jax_sharding_ext.port"
