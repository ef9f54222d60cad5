"""One finding of the porting tool, printed as linters print theirs."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
  """`path:line:col: CODE message`; `line` and `col` count from 1.

  Codes: `JSE1xx` an import this package replaces (`--write` rewrites it),
  `JSE2xx` a use whose meaning changed, `JSE3xx` a JAX API removed with no
  replacement here (the message names the modern one).
  """
  path: str
  line: int
  col: int
  code: str
  message: str

  @property
  def fixable(self) -> bool:
    """True when `--write` fixes it (the `JSE1xx` imports)."""
    return self.code.startswith("JSE1")

  def __str__(self) -> str:
    return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"
