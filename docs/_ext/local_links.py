"""Check the built site's internal links, anchors and images, with no network.

After an HTML build, every link and image of every page that points inside
the site (an `href` or `src` without a scheme such as `https:`) must name a
file of the build, and its `#fragment` an `id` in the page it points to. Each
broken one is a warning naming the page and the link, so under `-W` (as
`make docs` builds) the build fails. Sphinx's own `linkcheck` builder also
follows external links, which needs the network; external links are not
checked here.
"""

from __future__ import annotations

import pathlib
import urllib.parse
from html.parser import HTMLParser

from sphinx.util import logging

_LINKS = {("a", "href"), ("link", "href"), ("area", "href"), ("img", "src"),
          ("script", "src"), ("iframe", "src"), ("source", "src")}
# Generated folders whose pages are not the site's own (the theme's assets,
# the copied sources).
_SKIP = ("_static", "_sources")


class _Page(HTMLParser):
  """The ids a page defines and the links it makes."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.ids: set[str] = set()
    self.links: list[str] = []

  def handle_starttag(self, tag, attrs):
    for name, value in attrs:
      if value is None:
        continue
      if name == "id" or (tag == "a" and name == "name"):
        self.ids.add(value)
      if (tag, name) in _LINKS:
        self.links.append(value)


def _parse(path: pathlib.Path) -> _Page:
  page = _Page()
  page.feed(path.read_text(encoding="utf-8", errors="replace"))
  page.close()
  return page


def broken_links(outdir: pathlib.Path) -> list[tuple[str, str, str]]:
  """`(page, link, why)` for every internal link of the site that is broken."""
  outdir = outdir.resolve()
  pages = {p.resolve(): _parse(p) for p in sorted(outdir.rglob("*.html"))
           if p.relative_to(outdir).parts[0] not in _SKIP}
  found = []
  for path, page in pages.items():
    for link in page.links:
      url = urllib.parse.urlsplit(link)
      if url.scheme or url.netloc or link in ("", "#"):
        continue  # external (or the theme's empty anchors)
      target = path if not url.path else (path.parent / urllib.parse.unquote(url.path)).resolve()
      if url.path.endswith("/"):
        target = target / "index.html"
      where = str(path.relative_to(outdir))
      if not target.is_relative_to(outdir):
        found.append((where, link, "points outside the site"))
      elif not target.is_file():
        found.append((where, link, "no such file in the build"))
      elif url.fragment and target.suffix == ".html":
        ids = pages[target].ids if target in pages else _parse(target).ids
        if urllib.parse.unquote(url.fragment) not in ids:
          found.append((where, link, "no such anchor in the page"))
  return found


def _check(app, exception) -> None:
  if exception is not None or app.builder.format != "html":
    return
  log = logging.getLogger(__name__)
  for page, link, why in broken_links(pathlib.Path(app.outdir)):
    log.warning("broken internal link in %s: %r (%s)", page, link, why)


def setup(app):
  app.connect("build-finished", _check)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
