"""The timeline: a call's collectives across its ranks on one time axis, and the trace folder
(``--dist-trace-dir``) written from it: a picture, Chrome trace events, Flight Recorder dumps.

* :mod:`~harness.timeline.model`        the ``Timeline`` record every file is written from
* :mod:`~harness.timeline.build`        a call's ``Timeline``, from its ranks' traces and verdicts
* :mod:`~harness.timeline.folder`       a test's folder: its safe name, its three files written
* :mod:`~harness.timeline.spool`        passing tests' folders, written at the session's end
* :mod:`~harness.timeline.page`         the picture (``timeline.html``): one self-contained page
* :mod:`~harness.timeline.look`         the picture's style and script
* :mod:`~harness.timeline.layout`       where each part of the picture goes, in pixels
* :mod:`~harness.timeline.axis`         the picture's time axis, long idle stretches shortened
* :mod:`~harness.timeline.chrome_trace` the ``Timeline`` as Chrome trace events (``trace.json``)
* :mod:`~harness.timeline.flight_dumps` the ``Timeline`` as Flight Recorder dumps (``fr/``)

No call needs any of it: it is drawn from what a call returned (its error, its ranks'
traces, the verdicts' marks), so it sits above the controller, which never imports it; of the
controller it reads only the kinds of the verdicts' marks
(:data:`~harness.controller.verdicts.MISMATCH`, :data:`~harness.controller.verdicts.HANG`).
The plugin decides which tests get a folder (:mod:`harness.plugin.trace_folders`: it needs
pytest, which this package does not import). Modules are named by what they hold, the
package saying what they are of: the record, its building, the folder and the files in it.
"""
