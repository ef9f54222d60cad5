"""The machinery behind the public `serialization` module, one module per concern:

- `metadata`: the metadata of a new array (the GDA-era module's, or stock's);
- `locations`: where a spec stores its array, as tensorstore resolves it;
- `checks`: what a save or restore checks before it writes or reads;
- `markers`: commit markers and one writer per path;
- `integrity`: chunk records, so a checkpoint restores exactly or raises;
- `chunkfiles`: reading chunk files and checking their crc32;
- `saving` / `reading`: how a save and a restore run;
- `recording`: saves and restores in the transfer ledger;
- `running`: running their coroutines from any thread;
- `args`: the two calling conventions of the old deserialization functions;
- `manager`: the GDA-era checkpoint managers.

Needs tensorstore, an optional extra; `serialization` imports it first and
names the extra when it is missing.
"""
