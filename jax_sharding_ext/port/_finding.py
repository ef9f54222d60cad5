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
  """
  path: str
  line: int
  col: int
  code: str
  message: str
  fixable: bool = dataclasses.field(default=False, compare=False)

  def __str__(self) -> str:
    return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"
