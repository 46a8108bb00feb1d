"""The one QObject between Qt and the engine facade.

    bridge = EngineBridge()              # or EngineBridge(engine_factory=FakeEngine) in tests
    bridge.models_changed.connect(window.on_models_changed)
    bridge.start()                       # opens the device on the worker
    bridge.load("/models/a.gguf")        # returns at once; progress and result come as signals
    bridge.shutdown(1.5)                 # endpoint, then engine, within a deadline

Every method here only queues a job, so the UI thread never waits for the device, a load or
the endpoint. The worker is four lanes, each a thread that runs its jobs in order:

- control: opening the engine, pin, evict, warm, unload, settings, the endpoint, yields;
- load: loads and reloads, one at a time (a load parses the file on its caller's thread
  for seconds; pins and evicts must not wait for that);
- generate: the chat box's requests;
- status: the status reads (status() and vram() read bookkeeping, so they answer while the
  engine thread is busy), the arena's state.

The bridge calls only the engine facade (engine.facade.EngineAPI). Idle eviction and yields
are the engine's: the bridge hands it the settings and logs what it reports (subscribe).
The engine itself runs device work on its own thread, one job at a time, so lanes never
race on the device. Results come back as signals, emitted on a lane and delivered (queued)
to receivers on the UI thread. The lanes are daemon threads: a quit never waits on a load
that is still parsing.

The package, by concern: core.py (EngineBridge: signals, life cycle, the requests the UI
makes, status), jobs.py (the jobs the lanes run on the engine), serving.py (the local
endpoint's control) with endpoint.py (the HTTP server's thread) and observed.py (the engine
as the endpoint sees it), lanes.py (the lanes and the real engine's factory), messages.py
(one-line messages for failures).
"""
from .core import CLOSE_TIMEOUT_S, YIELD_S, EngineBridge

__all__ = ["CLOSE_TIMEOUT_S", "YIELD_S", "EngineBridge"]
