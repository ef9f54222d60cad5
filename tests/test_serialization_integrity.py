"""A checkpoint `jax_sharding_ext.serialization` writes restores exactly or
raises: a missing chunk, one flipped byte in a chunk, a chunk replaced by
another valid one (an older step's, another array's, a swap) and a changed
layout in the metadata are errors with the GDA-era metadata (gzip) and with
`metadata="stock"` (zstd) alike, and so are a changed zarr3 layout (the
`bytes` codec's endian, an added `transpose`) and a copy made in name order
and cut short, while all-zero and partly-zero arrays round-trip and
checkpoints of other writers (stock `array_serialization`, GDA-era files
that leave out chunks equal to the fill value) restore as before.

Stock `array_serialization` reads a missing chunk as zeros and a zstd chunk
with a flipped byte as whatever it decodes to; the tests show that on the same
damage, side by side.
"""

import asyncio
import json
import os
import shutil
import zlib

import numpy as np
import pytest
import tensorstore as ts
from jax.experimental.array_serialization import serialization as stock
from jax.experimental.array_serialization import tensorstore_impl as stock_impl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_sharding_ext import GlobalDeviceArray, serialization
from jax_sharding_ext._checkpoint import chunkfiles

RECORD = "jax_sharding_ext.chunks.0"
FORMATS = ["gda_serialization", "stock"]


def _gda(mesh, spec=None, shape=(8, 4), data=None):
  spec = P("x", "y") if spec is None else spec
  if data is None:
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) * 1.5 + 1
  return GlobalDeviceArray.from_callback(shape, mesh, spec, lambda i: data[i]), data


def _spec(path):
  return serialization.get_tensorstore_spec(str(path))


def _save_run(arr, path, **kw):
  serialization.run_serialization([arr], [_spec(path)], **kw)


def _save_manager(arr, path, **kw):
  manager = serialization.GlobalAsyncCheckpointManager()
  manager.serialize([arr], [_spec(path)], on_commit_callback=lambda: None, **kw)
  manager.wait_until_finished()


def _save_async(arr, path, **kw):
  async def go():
    futures = []
    await serialization.async_serialize(arr, _spec(path), futures, **kw)
    for f in futures:  # as GDA-era callers waited for the commit futures
      f.result()
  asyncio.run(go())


SAVES = {"run_serialization": _save_run, "manager.serialize": _save_manager,
         "async_serialize": _save_async}


def _restore(mesh, path):
  return np.asarray(serialization.run_deserialization([mesh], [P("x")], [_spec(path)])[0])


def _restore_stock(mesh, path):
  """Stock's `async_deserialize` (what its `run_deserialization` runs); the
  loop waits for stock's other reads when one fails, as its own would not."""
  async def go():
    try:
      return await stock.async_deserialize(NamedSharding(mesh, P("x")), _spec(path))
    finally:
      await asyncio.gather(*(asyncio.all_tasks() - {asyncio.current_task()}),
                           return_exceptions=True)
  return np.asarray(asyncio.run(go()))


def _flip(path, at):
  data = bytearray(path.read_bytes())
  data[at] ^= 0x10
  path.write_bytes(bytes(data))


# -- a missing chunk ------------------------------------------------------------------


@pytest.mark.parametrize("save", list(SAVES))
@pytest.mark.parametrize("metadata", FORMATS)
def test_a_missing_chunk_is_an_error(mesh_2d, tmp_path, metadata, save):
  """Every chunk is written, so a missing one is a lost one: each restore
  path raises, naming the chunk. Stock restores the same checkpoint with
  that shard as zeros."""
  gda, data = _gda(mesh_2d)
  SAVES[save](gda, tmp_path / "w", metadata=metadata)
  np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "w"), data)
  (tmp_path / "w" / "2.1").unlink()
  damaged = r"is damaged: its chunk '2.1' is missing"
  with pytest.raises(ValueError, match=damaged):
    _restore(mesh_2d, tmp_path / "w")
  with pytest.raises(ValueError, match=damaged):
    asyncio.run(serialization.async_deserialize(mesh_2d, P(), _spec(tmp_path / "w")))
  with pytest.raises(ValueError, match=damaged):
    serialization.GlobalAsyncCheckpointManager().deserialize(
        [NamedSharding(mesh_2d, P("y"))], [_spec(tmp_path / "w")])
  silently = _restore_stock(mesh_2d, tmp_path / "w")
  assert (silently[4:6, 2:4] == 0).all() and (data[4:6, 2:4] != 0).all()


def test_only_the_chunks_a_restore_reads_are_checked(mesh_factory, tmp_path):
  """A process checks the chunks its devices read (here: one device reads
  rows 0-1), so a lost chunk elsewhere does not stop it."""
  mesh = mesh_factory((4, 2), ("x", "y"))
  gda, data = _gda(mesh)
  _save_run(gda, tmp_path / "w", metadata="stock")
  (tmp_path / "w" / "3.1").unlink()
  one = mesh_factory((1,), ("x",))
  np.testing.assert_array_equal(
      np.asarray(serialization.run_deserialization([one], [P()], [_spec(tmp_path / "w")],
                                                   [(2, 4)])[0]), data[:2])
  with pytest.raises(ValueError, match="its chunk '3.1' is missing"):
    _restore(mesh, tmp_path / "w")


# -- a flipped byte ---------------------------------------------------------------------


@pytest.mark.parametrize("metadata", FORMATS)
def test_a_flipped_byte_anywhere_in_a_chunk_restores_exactly_or_raises(
    mesh_2d, tmp_path, metadata):
  """Each byte of one chunk flipped in turn: the restore gives the saved
  values or raises a ValueError saying the checkpoint is damaged, never other
  values. With zstd (no checksum of its own) every flip raises, by the crc32
  the package recorded; with gzip, flips in the gzip header's time stamp and
  flags that change no data restore exactly, all others fail gzip's CRC.
  Stock restores some of the same zstd flips as other values."""
  gda, data = _gda(mesh_2d)
  _save_run(gda, tmp_path / "w", metadata=metadata)
  chunk = tmp_path / "w" / "1.0"
  original = chunk.read_bytes()
  exact, wrong, errors, stock_wrong = [], [], [], []
  for at in range(len(original)):
    _flip(chunk, at)
    try:
      got = _restore(mesh_2d, tmp_path / "w")
    except ValueError as e:
      errors.append(str(e))
      if metadata == "stock":
        try:
          if not np.array_equal(_restore_stock(mesh_2d, tmp_path / "w"), data):
            stock_wrong.append(at)
        except ValueError:  # stock's zstd decoder refuses some flips (e.g. in the header)
          pass
    else:
      (exact if np.array_equal(got, data) else wrong).append(at)
    chunk.write_bytes(original)
  assert wrong == [], f"flipped bytes {wrong} restored as other values"
  assert all("is damaged" in e for e in errors), errors
  np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "w"), data)
  if metadata == "stock":
    assert exact == [] and len(errors) == len(original)
    assert stock_wrong
  else:
    assert len(errors) > len(original) // 2, (exact, errors)


@pytest.mark.parametrize("metadata", FORMATS)
def test_a_chunk_changed_after_a_good_restore_is_still_caught(mesh_2d, tmp_path, metadata):
  """A chunk checked by one restore is checked again once its file changed;
  put back, it restores again."""
  gda, data = _gda(mesh_2d)
  _save_run(gda, tmp_path / "w", metadata=metadata)
  np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "w"), data)
  chunk = tmp_path / "w" / "3.0"
  original = chunk.read_bytes()
  _flip(chunk, len(original) - 3)  # the gzip trailer (CRC) / zstd payload
  with pytest.raises(ValueError, match="is damaged"):
    _restore(mesh_2d, tmp_path / "w")
  chunk.write_bytes(original)
  np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "w"), data)


@pytest.mark.parametrize("name", [".zarray", RECORD])
def test_a_flipped_byte_in_the_metadata_or_the_record_restores_exactly_or_raises(
    mesh_2d, tmp_path, name):
  gda, data = _gda(mesh_2d)
  _save_run(gda, tmp_path / "w", metadata="stock")
  path = tmp_path / "w" / name
  original = path.read_bytes()
  for at in range(len(original)):
    _flip(path, at)
    try:
      got = _restore(mesh_2d, tmp_path / "w")
    except ValueError:
      pass
    else:
      np.testing.assert_array_equal(got, data, err_msg=f"{name}: byte {at} flipped")
    path.write_bytes(original)


# -- what is written and what still restores ---------------------------------------------


def _zarr3_spec(path, fill_zero=True):
  metadata = {"shape": [8, 4], "data_type": "float32",
              "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}}}
  if fill_zero:
    metadata["fill_value"] = 0
  return {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)},
          "metadata": metadata}


@pytest.mark.parametrize("kind", ["zarr, fill_value 0", "zarr3, fill_value 0"])
@pytest.mark.parametrize("zeros", ["all zero", "partly zero"])
def test_zero_arrays_round_trip_with_every_chunk_stored(mesh_2d, tmp_path, kind, zeros):
  """tensorstore leaves out chunks equal to the fill value unless told
  otherwise; the package stores them, so they round-trip and a lost one is
  still an error."""
  data = np.zeros((8, 4), np.float32)
  if zeros == "partly zero":
    data[:2] = 7
  gda, _ = _gda(mesh_2d, data=data)
  path = tmp_path / "w"
  if kind.startswith("zarr3"):
    spec = _zarr3_spec(path)
    chunk = path / "c" / "3" / "1"
  else:
    spec = dict(_spec(path), metadata={"fill_value": 0, "compressor": {"id": "zstd"},
                                       "dtype": "<f4", "chunks": [2, 2], "shape": [8, 4]})
    chunk = path / "3.1"
  serialization.run_serialization([gda], [spec])
  got = np.asarray(serialization.run_deserialization([mesh_2d], [P("x")], [spec])[0])
  np.testing.assert_array_equal(got, data)
  assert chunk.exists()
  chunk.unlink()
  with pytest.raises(ValueError, match="is missing"):
    serialization.run_deserialization([mesh_2d], [P("x")], [spec])


def test_the_record_is_a_small_json_file_next_to_the_array(mesh_2d, tmp_path):
  """What is recorded, and where: one JSON file per process in the array's
  directory; tensorstore and stock read the array as before."""
  gda, data = _gda(mesh_2d)
  _save_run(gda, tmp_path / "z", metadata="stock")
  _save_run(gda, tmp_path / "g")
  z = json.loads((tmp_path / "z" / RECORD).read_text())
  assert z["processes"] == 1 and z["shape"] == [8, 4] and z["dtype"] == "float32"
  assert z["chunk_shape"] == [2, 2] and z["checksum"] == "crc32"
  assert sorted(z["chunks"]) == sorted(f"{i}.{j}" for i in range(4) for j in range(2))
  assert z["chunks"]["1.0"] == zlib.crc32((tmp_path / "z" / "1.0").read_bytes())
  assert z["layout"] == {"order": "C", "byte_order": "<"}
  g = json.loads((tmp_path / "g" / RECORD).read_text())
  # A gzip chunk ends with the CRC-32 and length of its contents: the record
  # keeps those 8 bytes (tensorstore checks them against the contents).
  assert g["checksum"] == "tail8"
  gzip_tail = (tmp_path / "g" / "1.0").read_bytes()[-8:]
  assert g["chunks"]["1.0"] == int.from_bytes(gzip_tail, "little")
  for name in ("z", "g"):
    np.testing.assert_array_equal(_restore_stock(mesh_2d, tmp_path / name), data)
    t = ts.open(_spec(tmp_path / name), open=True).result()
    np.testing.assert_array_equal(t.read().result(), data)


def _save_awaited(arr, path, **kw):
  asyncio.run(serialization.async_serialize(arr, _spec(path), **kw))


@pytest.mark.parametrize("save", [_save_run, _save_awaited], ids=["run", "async_serialize"])
def test_each_recorded_crc32_is_the_chunk_files_as_saved_also_if_rewritten_after_landing(
    mesh_2d, tmp_path, monkeypatch, save):
  """A save takes the crc32 of each chunk file as it lands, while the others
  are still written; a chunk written again after that (a new file renamed
  into place) is recorded as it finally is, so the checkpoint restores as
  saved. The same over an existing checkpoint (its files replaced)."""
  gda, data = _gda(mesh_2d, shape=(256, 128))  # one chunk per shard: "0.0" is [0:64, 0:64]
  again = np.full((64, 64), 7.0, np.float32)
  want = data.copy()
  want[:64, :64] = again
  read, landed = [], []
  real_crc = chunkfiles._crc_of_file

  def spying_crc(path):
    read.append(os.path.basename(path))
    return real_crc(path)

  real_serialize = serialization._jax_checkpoint.async_serialize

  async def write_then_rewrite(arr, spec, *args, **kwargs):
    out = await real_serialize(arr, spec, *args, **kwargs)
    for _ in range(2000):  # until its crc32 was taken as it landed (the record is not begun)
      if "0.0" in read:
        landed.append("0.0")
        break
      await asyncio.sleep(0.005)
    t = await ts.open(ts.Spec(spec), open=True)
    await t[:64, :64].write(again)
    return out

  monkeypatch.setattr(chunkfiles, "_crc_of_file", spying_crc)
  monkeypatch.setattr(serialization._jax_checkpoint, "async_serialize", write_then_rewrite)
  for _ in ("fresh", "over the first"):
    read.clear()
    landed.clear()
    save(gda, tmp_path / "w", metadata="stock")
    assert "0.0" in landed
    record = json.loads((tmp_path / "w" / RECORD).read_text())
    assert len(record["chunks"]) == 8
    for key, crc in record["chunks"].items():
      assert crc == zlib.crc32((tmp_path / "w" / key).read_bytes()), key
    np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "w"), want)


def test_checkpoints_of_other_writers_restore_as_before(mesh_2d, tmp_path):
  """Without the package's record a checkpoint keeps its writer's meaning: a
  GDA-era file that left out a chunk equal to the fill value reads it as the
  fill value, and a stock checkpoint restores as stock restores it."""
  data = np.arange(32, dtype=np.float32).reshape(8, 4)
  data[2:4, 2:4] = 0
  old = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(tmp_path / "old")},
                 "metadata": {"shape": [8, 4], "chunks": [2, 2], "dtype": "<f4",
                              "compressor": {"id": "gzip"}, "fill_value": 0}},
                create=True).result()
  old.write(data).result()
  assert not (tmp_path / "old" / "1.1").exists()  # left out: equal to the fill value
  np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "old"), data)
  arr = _gda(mesh_2d)[0].to_jax_array()
  stock.run_serialization([arr], [_spec(tmp_path / "stock")])
  np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "stock"), np.asarray(arr))
  (tmp_path / "stock" / "0.0").unlink()  # stock's meaning: that shard reads as zeros
  np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "stock"),
                                _restore_stock(mesh_2d, tmp_path / "stock"))


# -- a chunk replaced by another valid one -----------------------------------------------


def _replace_from_older_step(tmp_path):
  shutil.copy(tmp_path / "old" / "1.0", tmp_path / "w" / "1.0")


def _swap_two_chunks(tmp_path):
  a, b = tmp_path / "w" / "1.0", tmp_path / "w" / "2.1"
  a_bytes = a.read_bytes()
  a.write_bytes(b.read_bytes())
  b.write_bytes(a_bytes)


def _replace_from_another_array(tmp_path):
  shutil.copy(tmp_path / "other" / "1.0", tmp_path / "w" / "1.0")


@pytest.mark.parametrize("damage", [_replace_from_older_step, _swap_two_chunks,
                                    _replace_from_another_array])
@pytest.mark.parametrize("metadata", FORMATS)
def test_a_chunk_replaced_by_another_valid_chunk_is_an_error(mesh_2d, tmp_path, metadata,
                                                             damage):
  """Each chunk file decodes on its own (a gzip chunk's CRC matches its own
  contents), so only the record tells that it is not the chunk written
  here. Stock restores the same checkpoint with the other chunk's values."""
  old, _ = _gda(mesh_2d, data=np.full((8, 4), 1.0, np.float32))
  other, _ = _gda(mesh_2d, data=np.full((8, 4), -7.0, np.float32))
  gda, data = _gda(mesh_2d)
  _save_run(old, tmp_path / "old", metadata=metadata)
  _save_run(other, tmp_path / "other", metadata=metadata)
  _save_run(gda, tmp_path / "w", metadata=metadata)
  np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "w"), data)  # checked once
  damage(tmp_path)
  with pytest.raises(ValueError, match=r"is damaged: its chunk '(1\.0|2\.1)' has .* was "
                     r"recorded when it was written: it was changed or replaced"):
    _restore(mesh_2d, tmp_path / "w")
  silently = _restore_stock(mesh_2d, tmp_path / "w")
  assert not np.array_equal(silently, data)


@pytest.mark.parametrize("edit", [{"order": "F"}, {"dtype": ">f4"}])
@pytest.mark.parametrize("metadata", FORMATS)
def test_a_changed_layout_in_the_metadata_is_an_error(mesh_2d, tmp_path, metadata, edit):
  """zarr's `order` and the byte order of its dtype say how a chunk's bytes
  become values: changed, every chunk still decodes, to other values. Stock
  restores the permuted (or byte-swapped) values."""
  gda, data = _gda(mesh_2d)
  _save_run(gda, tmp_path / "w", metadata=metadata)
  zarray = tmp_path / "w" / ".zarray"
  zarray.write_text(json.dumps({**json.loads(zarray.read_text()), **edit}))
  with pytest.raises(ValueError, match=r"is damaged: its metadata \(shape, dtype, chunk shape, "
                     r"layout .*\) differs from the recorded"):
    _restore(mesh_2d, tmp_path / "w")
  silently = _restore_stock(mesh_2d, tmp_path / "w")
  assert silently.shape == data.shape and not np.array_equal(silently, data)


@pytest.mark.parametrize("metadata", FORMATS)
def test_saving_again_over_a_checkpoint_records_the_new_chunks(mesh_2d, tmp_path, metadata):
  first, _ = _gda(mesh_2d)
  second, want = _gda(mesh_2d, data=np.full((8, 4), 3.0, np.float32))
  for save in SAVES.values():
    save(first, tmp_path / "w", metadata=metadata)
    save(second, tmp_path / "w", metadata=metadata)
    np.testing.assert_array_equal(_restore(mesh_2d, tmp_path / "w"), want)


def test_a_lost_record_with_others_left_is_an_error(mesh_2d, tmp_path):
  gda, _ = _gda(mesh_2d)
  _save_run(gda, tmp_path / "w", metadata="stock")
  shutil.copy(tmp_path / "w" / RECORD, tmp_path / "w" / "jax_sharding_ext.chunks.1")
  os.remove(tmp_path / "w" / RECORD)
  with pytest.raises(ValueError, match=f"its chunk record '{RECORD}' is missing"):
    _restore(mesh_2d, tmp_path / "w")


# -- a copy cut short -------------------------------------------------------------------

MARK = ".jax_sharding_ext"


@pytest.mark.parametrize("kind", FORMATS + ["zarr3"])
def test_a_copy_in_name_order_cut_short_restores_exactly_or_raises(mesh_2d, tmp_path, kind):
  """rsync and object-store tools copy a directory in name order. The
  package's mark sorts first and the record after the chunks, so a copy cut
  after any chunk has the mark and may lack the record: it is refused as
  damaged, never taken for another writer's checkpoint with chunks read as
  zeros; the complete copy restores. Stock restores the cut copies with
  zeros."""
  gda, data = _gda(mesh_2d)
  w = tmp_path / "w"
  if kind == "zarr3":
    spec = lambda d: {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(d)}}
    serialization.run_serialization([gda], [spec(w)])
  else:
    spec = _spec
    _save_run(gda, w, metadata=kind)
  names = sorted(str(p.relative_to(w)) for p in w.rglob("*") if p.is_file())
  assert names[0] == MARK and names[-1] in (RECORD, "zarr.json")
  restore = lambda d: serialization.run_deserialization([mesh_2d], [P("x")], [spec(d)])[0]
  stock_zeros = []
  for cut in range(len(names) + 1):
    copy = tmp_path / f"copy_{cut}"
    copy.mkdir()
    for name in names[:cut]:
      (copy / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copyfile(w / name, copy / name)
    if cut == len(names):
      np.testing.assert_array_equal(np.asarray(restore(copy)), data)
      break
    with pytest.raises(ValueError) as refused:
      restore(copy)
    if ".zarray" in names[:cut]:  # the metadata is there: only the mark tells
      assert f"'{RECORD}' is missing, though its '{MARK}' mark" in str(refused.value)
      stock_zeros.append(bool((_restore_stock(mesh_2d, copy) == 0).any()))
  assert kind == "zarr3" or any(stock_zeros)


@pytest.mark.parametrize("save", list(SAVES))
def test_the_mark_is_written_before_the_first_chunk_and_kept(mesh_2d, tmp_path, monkeypatch,
                                                            save):
  """The mark is in the directory before tensorstore writes anything there
  (a save that stops at any point leaves it) and stays after the commit;
  stock and tensorstore read the array as before."""
  gda, data = _gda(mesh_2d)
  seen = []
  real_serialize = serialization._jax_checkpoint.async_serialize

  async def spying(arr, spec, *args, **kwargs):
    seen.append(sorted(os.listdir(tmp_path / "w")))
    return await real_serialize(arr, spec, *args, **kwargs)
  monkeypatch.setattr(serialization._jax_checkpoint, "async_serialize", spying)
  monkeypatch.setattr(stock_impl, "async_serialize", spying)  # what stock's manager calls
  SAVES[save](gda, tmp_path / "w")
  monkeypatch.undo()
  assert MARK in seen[0] and ".zarray" not in seen[0]
  assert json.loads((tmp_path / "w" / MARK).read_text())["written_by"] == "jax_sharding_ext"
  np.testing.assert_array_equal(_restore_stock(mesh_2d, tmp_path / "w"), data)
  (tmp_path / "w" / RECORD).unlink()
  with pytest.raises(ValueError, match=f"'{RECORD}' is missing, though its '{MARK}' mark"):
    _restore(mesh_2d, tmp_path / "w")


def test_a_checkpoint_of_0_1_0_without_the_mark_is_checked_by_its_record(mesh_2d, tmp_path):
  """jax_sharding_ext 0.1.0 wrote records but no mark (and no zarr3 codecs):
  its checkpoints are checked as it checked them."""
  gda, data = _gda(mesh_2d)
  for name, spec in (("v2", _spec(tmp_path / "v2")), ("v3", _zarr3_spec(tmp_path / "v3"))):
    serialization.run_serialization([gda], [spec])
    (tmp_path / name / MARK).unlink()
    if name == "v3":
      record = json.loads((tmp_path / name / RECORD).read_text())
      del record["codecs"]
      (tmp_path / name / RECORD).write_text(json.dumps(record))
    restore = lambda spec=spec: serialization.run_deserialization([mesh_2d], [P("x")],
                                                                  [spec])[0]
    np.testing.assert_array_equal(np.asarray(restore()), data)
    chunk = tmp_path / name / ("1.0" if name == "v2" else "c/1/0")
    _flip(chunk, len(chunk.read_bytes()) - 1)
    with pytest.raises(ValueError, match="was changed or replaced"):
      restore()


# -- zarr3 layout --------------------------------------------------------------------------


def _transpose_first(metadata):
  return dict(metadata, codecs=[{"name": "transpose", "configuration": {"order": [1, 0]}},
                                *metadata["codecs"]])


def _big_endian(metadata):
  return dict(metadata, codecs=[{"name": "bytes", "configuration": {"endian": "big"}}
                                if c["name"] == "bytes" else c for c in metadata["codecs"]])


def _no_transpose(metadata):
  return dict(metadata, codecs=[c for c in metadata["codecs"] if c["name"] != "transpose"])


ZARR3_CODECS = {
    "stock's (bytes)": None,
    "bytes, gzip": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip"}],
    "transpose, bytes, zstd": [{"name": "transpose", "configuration": {"order": [1, 0]}},
                               {"name": "bytes", "configuration": {"endian": "little"}},
                               {"name": "zstd"}],
}


@pytest.mark.parametrize("edit", [_big_endian, _transpose_first, _no_transpose])
@pytest.mark.parametrize("codecs", list(ZARR3_CODECS))
def test_a_changed_zarr3_layout_is_an_error(mesh_2d, tmp_path, codecs, edit):
  """zarr3's codecs say how a chunk's bytes become values (a `transpose`
  order, the `bytes` codec's endian): changed in `zarr.json`, every chunk
  still decodes, to other values. The record keeps the layout, so the
  restore refuses as zarr v2's `order` and byte order are refused; stock
  restores the byte-swapped or transposed values."""
  gda, data = _gda(mesh_2d)
  spec = _zarr3_spec(tmp_path / "w")
  if ZARR3_CODECS[codecs] is not None:
    spec["metadata"]["codecs"] = ZARR3_CODECS[codecs]
  else:
    del spec["metadata"]["fill_value"]
  serialization.run_serialization([gda], [spec])
  restore = lambda: serialization.run_deserialization([mesh_2d], [P("x")], [{
      "driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "w")}}])[0]
  np.testing.assert_array_equal(np.asarray(restore()), data)
  zarr_json = tmp_path / "w" / "zarr.json"
  before = json.loads(zarr_json.read_text())
  after = edit(before)
  if after == before:
    return  # nothing to take away
  zarr_json.write_text(json.dumps(after))
  with pytest.raises(ValueError, match=r"is damaged: its metadata \(shape, dtype, chunk shape, "
                     r"layout .*\) differs from the recorded"):
    restore()
  async def stock_read():
    return await stock.async_deserialize(NamedSharding(mesh_2d, P("x")), {
        "driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "w")}})
  silently = np.asarray(asyncio.run(stock_read()))
  assert silently.shape == data.shape and not np.array_equal(silently, data)


def test_the_record_keeps_the_zarr3_layout(mesh_2d, tmp_path):
  """What a zarr3 record keeps: the codecs up to the array-to-bytes one with
  their configuration, the byte codecs after it by name; under its own key,
  so jax_sharding_ext 0.1.0 (which reads `layout`, `{}` for zarr3) still reads
  the record."""
  gda, _ = _gda(mesh_2d)
  spec = _zarr3_spec(tmp_path / "w")
  spec["metadata"]["codecs"] = ZARR3_CODECS["transpose, bytes, zstd"]
  serialization.run_serialization([gda], [spec])
  record = json.loads((tmp_path / "w" / RECORD).read_text())
  assert record["layout"] == {} and record["codecs"] == [
      {"name": "transpose", "configuration": {"order": [1, 0]}},
      {"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd"}]
