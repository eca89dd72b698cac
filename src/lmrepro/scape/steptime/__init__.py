"""The step-time model of dense against SCAPE data-parallel training (docs/steptime.md): the
alpha-beta model (:mod:`~lmrepro.scape.steptime.model`), its calibration on the shaped-link
benchmark (:mod:`~lmrepro.scape.steptime.fit`), the paper's configurations
(:mod:`~lmrepro.scape.steptime.paper`), the report of notebook 09
(:mod:`~lmrepro.scape.steptime.report`) and ``lmrepro predict``
(:mod:`~lmrepro.scape.steptime.predict_cli`)."""
