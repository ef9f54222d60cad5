"""Parsing one module and running the analysis and the rewrite on it (libcst)."""

from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import MetadataWrapper

from jax_sharding_ext.port._analyze import analyze
from jax_sharding_ext.port._finding import Finding
from jax_sharding_ext.port._rewrite import Rewriter


def parse(source: str | bytes, path: str) -> cst.Module:
  """The module, or a `SyntaxError` naming `path`, the line and the column
  (Python's own, which places errors better than libcst's parser)."""
  try:
    return cst.parse_module(source)
  except (cst.ParserSyntaxError, UnicodeDecodeError, ValueError) as e:
    try:
      compile(source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as py_err:
      py_err.filename = path
      raise py_err from None
    except ValueError as py_err:  # e.g. a null byte
      raise SyntaxError(str(py_err), (path, 1, 1, None)) from None
    if isinstance(e, cst.ParserSyntaxError):
      raise SyntaxError(e.message, (path, e.raw_line, e.raw_column + 1, None)) from None
    raise SyntaxError(str(e), (path, 1, 1, None)) from None


def check_module(module: cst.Module, path: str) -> tuple[list[Finding], cst.Module]:
  """The findings, and the module with its `JSE1xx` imports rewritten."""
  wrapper = MetadataWrapper(module)
  findings, plans = analyze(wrapper, path)
  fixed = wrapper.module.visit(Rewriter(plans)) if plans else module
  return findings, fixed


def _as_given(module: cst.Module, source: str | bytes) -> str | bytes:
  return module.bytes if isinstance(source, bytes) else module.code


def check(source: str | bytes, path: str = "<source>") -> list[Finding]:
  return check_module(parse(source, path), path)[0]


def fix(source: str | bytes) -> str | bytes:
  fixed = check_module(parse(source, "<source>"), "<source>")[1]
  return _as_given(fixed, source)
