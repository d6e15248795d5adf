"""The timeline: a call's collectives across its ranks on one time axis, and the trace folder
(``--dist-trace-dir``) written from it: a picture, Chrome trace events, Flight Recorder dumps.

* :mod:`~harness.timeline.model`        the ``Timeline`` record every file is written from
* :mod:`~harness.timeline.build`        a call's ``Timeline``, from its ranks' traces and verdicts
* :mod:`~harness.timeline.folder`       a test's folder: its safe name, its three files written
* :mod:`~harness.timeline.spool`        passing tests' folders, written at the session's end
* :mod:`~harness.timeline.page`         the picture (``timeline.html``): one self-contained page,
  its style and script (the package's ``page.css`` and ``page.js``) written into it
* :mod:`~harness.timeline.plot`         the picture's plot: lanes, tracks, boxes, the mark (SVG)
* :mod:`~harness.timeline.layout`       where each part of the plot goes, in pixels
* :mod:`~harness.timeline.axis`         the plot's time axis, long idle stretches shortened
* :mod:`~harness.timeline.chrome_trace` the ``Timeline`` as Chrome trace events (``trace.json``)
* :mod:`~harness.timeline.flight_dumps` the ``Timeline`` as Flight Recorder dumps (``fr/``)

The modules are named by what they hold, the package saying what it is of; the picture is
made in steps, each a module: where things go (``layout``, on the ``axis``), the SVG drawn there
(``plot``), the page around it (``page``).

No call needs any of it: it is drawn from what a call returned (its error, its ranks'
traces, the verdicts' marks), so it sits above the controller, which never imports it; of the
controller it reads only the kinds of the verdicts' marks
(:data:`~harness.controller.verdicts.MISMATCH`, :data:`~harness.controller.verdicts.HANG`).
Which tests get a folder is the plugin's choice (:mod:`harness.plugin.trace_folders`): it
needs pytest, which this package does not import.
"""
