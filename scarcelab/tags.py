"""The names of scarcelab's run tags, one constant each (as MLflow's ``mlflow_tags.py``).

Tag names are public: DESIGN §4.2 lists the identity tags, and the query layer, resumes,
sweeps and users' own MLflow searches read the rest. Spelling each name once here means a
typo is an ``AttributeError`` at import instead of a tag nobody ever finds. The core writes
these tags through the ``Tracker`` interface and ``tracking/`` reads them back, so this module
imports nothing (the core never imports mlflow). Values are strings, as MLflow stores them.
"""

from __future__ import annotations

#: every scarcelab tag starts with this; user-supplied tags may not (``--tags`` refuses it)
PREFIX = "scarcelab."

# --- identity of a run (DESIGN §4.2) ------------------------------------------------------
#: what the run is: study | trial | retrain | al | al_sweep | al_report | probe | sweep |
#: sweep_launcher | contamination | tune_resume | encoding | report
ROLE = "scarcelab.role"
#: the method family: supervised | semi | self | active | transfer | segment
FAMILY = "scarcelab.family"
#: the registered method (or AL strategy, or ``linear_probe`` / ``hovernet_unet``)
METHOD = "scarcelab.method"
#: the registered dataset name
DATASET = "scarcelab.dataset"
#: the run's seed (for AL repetitions: the data seed)
SEED = "scarcelab.seed"
#: hash of the split's index lists (``scarcelab.data.splits``)
SPLIT_HASH = "scarcelab.split_hash"
#: ``scarcelab.__version__`` that wrote the run
VERSION = "scarcelab.version"
#: the backbone name (``scarcelab list archs``)
ARCH = "scarcelab.arch"

# --- studies and trials -------------------------------------------------------------------
#: the protocol a study ran: tune (Tune-It), or linear | finetune (probe / segment)
PROTOCOL = "scarcelab.protocol"
#: the hyperparameter search: random | none | fixed, or asha (Tune-It)
SEARCH = "scarcelab.search"
#: where the validation set came from: train | official
VAL_FROM = "scarcelab.val_from"
#: "true" when the validation images are also trained on (the user asked for it)
VAL_IN_TRAIN = "scarcelab.val_in_train"
#: where a fixed configuration came from (defaults, or the run it was read from)
HPARAMS_SOURCE = "scarcelab.hparams_source"
#: the class name a binary task detects (sensitivity and partial AUROC use it)
POSITIVE_CLASS = "scarcelab.positive_class"
#: the key a resumable study is found by (same configuration -> same key)
STUDY_KEY = "scarcelab.study_key"
#: the Optuna study name the trials were drawn from
OPTUNA_STUDY = "scarcelab.optuna_study"
#: the trial number, on a trial run
TRIAL = "scarcelab.trial"
#: why a trial stopped: patience | max_epochs | budget | asha
STOPPED = "scarcelab.stopped"
#: "true" / "false": whether a trial was pruned (ASHA)
PRUNED = "scarcelab.pruned"
#: the ASHA rung at which a pruned trial stopped
ASHA_RUNG = "scarcelab.asha_rung"
#: the number of trials a study ran
N_TRIALS = "scarcelab.n_trials"
#: the number of completed trials of a tune study
N_COMPLETE = "scarcelab.n_complete"
#: the number of pruned trials of a tune study
N_PRUNED = "scarcelab.n_pruned"
#: the number of failed trials
N_FAILED = "scarcelab.n_failed"
#: the selected trial's number
BEST_TRIAL = "scarcelab.best_trial"
#: the selected trial ended before its learning-rate schedule or its unlabeled-weight ramp
#: did (a short budget, patience): one sentence, also in the study's description
SCHEDULE_SHORT = "scarcelab.schedule_short"
#: a worker of a shared study that found every trial taken by other workers: why its
#: record has no model (protocols.search)
NO_TRIAL_LEFT = "scarcelab.no_trial_left"
#: the Optuna state of the selected trial: complete | pruned
BEST_TRIAL_STATE = "scarcelab.best_trial_state"
#: the selected configuration, as sorted JSON (what ``hparams_from`` reads)
BEST_PARAMS = "scarcelab.best_params"
#: the error (traceback tail) of a failed run, at most 5000 characters
ERROR = "scarcelab.error"
#: what a running study is doing now, for the terminal and the UI; "done" at the end
PHASE = "scarcelab.phase"
#: the provenance summary of the data files a run read
DATA_FILES = "scarcelab.data_files"

# --- Tune-It (``protocols/tune.py``) ------------------------------------------------------
#: the phase asked for: all | search | final
TUNE_PHASE = "scarcelab.tune_phase"
#: the retrain index, on a final-retraining run (role retrain)
RETRAIN = "scarcelab.retrain"
#: "true" on trials and retrains run after a resume
RESUMED = "scarcelab.resumed"
#: comma-separated trial numbers a resumed search kept
SEARCH_KEPT = "scarcelab.search_kept"
#: the number of kept trials when the search resumed
SEARCH_RESUMED_AT = "scarcelab.search_resumed_at"
#: comma-separated retrain indices a resumed final phase kept
FINAL_KEPT = "scarcelab.final_kept"
#: comma-separated retrain indices a resumed final phase ran again
FINAL_RESUMED = "scarcelab.final_resumed"

# --- dataset notes ------------------------------------------------------------------------
#: the test set a study used: official, or the stand-in (e.g. ciFAIR-10)
TEST_SET = "scarcelab.test_set"
#: the order of the training images in a reconstructed copy (e.g. JPEG file number)
TRAIN_ORDER = "scarcelab.train_order"
#: a user's own images (folder:/csv:): where the test set came from — folder (test/),
#: holdout (of the labeled images, --test-fraction) or fold (--folds)
TEST_FROM = "scarcelab.test_from"
#: the fold of a --folds k study, "i/k" (1-based): the leaderboard counts each fold of a
#: seed as a sample of its own
FOLD = "scarcelab.fold"
#: an AL sweep on data with a given unlabeled pool (a user's unlabeled/ images, a plugin's
#: ``unlabeled_x``): what became of that pool — not queried, since the simulated annotator
#: can only reveal labels the data has (and, for ``encoded_`` sets, that the encoder
#: trained on it)
UNLABELED_POOL = "scarcelab.unlabeled_pool"

# --- contamination ------------------------------------------------------------------------
#: the OOD source(s) mixed into the unlabeled set (comma-separated on the sweep run)
OOD = "scarcelab.ood"
#: the kind of OOD source; none at ratio 0
OOD_KIND = "scarcelab.ood_kind"
#: the contamination ratio of a child study (``:g``); absent on the tuning study
RATIO = "scarcelab.ratio"
#: the ratios of a contamination sweep, comma-separated
RATIOS = "scarcelab.ratios"
#: how the sweep's children were tuned: once (one study for all ratios) | per_ratio
TUNING = "scarcelab.tuning"
#: tuning, on the study that tunes the configuration every ratio reuses
SWEEP_ROLE = "scarcelab.sweep_role"
#: the key a resumable contamination sweep is found by
SWEEP_KEY = "scarcelab.sweep_key"

# --- transfer and segmentation ------------------------------------------------------------
#: the downstream task: probe | segment
TASK = "scarcelab.task"
#: the encoder spec: random, a weights file, runs:/<id>/model ...
ENCODER = "scarcelab.encoder"
#: the encoder's arch, as resolved
ENCODER_ARCH = "scarcelab.encoder_arch"
#: the encoder file's format (state dict, pt2, ...)
ENCODER_FORMAT = "scarcelab.encoder_format"
#: the input normalisation the encoder expects (none when unknown)
ENCODER_NORM = "scarcelab.encoder_norm"
#: a hash of the encoder's weights
ENCODER_FINGERPRINT = "scarcelab.encoder_fingerprint"
#: the file's tensors that did not fit the arch, comma-separated (at most 500 characters)
ENCODER_SKIPPED = "scarcelab.encoder_skipped"
#: the method that trained the encoder (random | unknown when not known)
ENCODER_METHOD = "scarcelab.encoder_method"
#: the family of the method that trained the encoder, when it came from a run
ENCODER_FAMILY = "scarcelab.encoder_family"
#: the run the encoder came from
ENCODER_RUN_ID = "scarcelab.encoder_run_id"
#: the share of the labeled pool used, ``:g``
LABEL_FRACTION = "scarcelab.label_fraction"
#: the key of the cached encoded features
ENCODING_KEY = "scarcelab.encoding_key"
#: where the encoded features came from (a cache hit, or computed)
ENCODING_SOURCE = "scarcelab.encoding_source"
#: cached | computed: whether a probe's encoded features came from the cache
FEATURES = "scarcelab.features"
#: the PQ that selects a segmentation checkpoint: image (per-image mean) | pooled
AGGREGATION = "scarcelab.aggregation"
#: the epoch whose checkpoint a segmentation study selected on validation
SELECTED_EPOCH = "scarcelab.selected_epoch"
#: the watershed edge threshold selected on validation
EDGE_THRESHOLD = "scarcelab.edge_threshold"

# --- active learning ----------------------------------------------------------------------
#: the number of images labeled per AL round
QUERY_SIZE = "scarcelab.query_size"
#: the repetition index of an AL run
REPETITION = "scarcelab.repetition"
#: the seed that chose the strategy's random draws
SEED_STRATEGY = "scarcelab.seed_strategy"
#: the seed of the initial labeled set and splits
SEED_DATA = "scarcelab.seed_data"
#: the seed of the classifier's training
SEED_MODEL = "scarcelab.seed_model"
#: a known leak the run reproduces on purpose (e.g. test-set early stopping)
LEAK = "scarcelab.leak"

# --- sweeps (``tracking/sweep``) ----------------------------------------------------------
#: the sweep's name, on the sweep run and every cell run
SWEEP = "scarcelab.sweep"
#: the sweep run's id, on the launcher run
SWEEP_RUN = "scarcelab.sweep_run"
#: the cell's id, on a cell run
CELL = "scarcelab.cell"
#: the cell's human-readable label
CELL_LABEL = "scarcelab.cell_label"
#: the driver (host:pid) running the sweep
SWEEP_DRIVER = "scarcelab.sweep_driver"
#: the attempt number of a cell run
SWEEP_ATTEMPT = "scarcelab.sweep_attempt"
#: on a dependent cell's run: {option: [reference, resolved value]} (JSON)
SWEEP_REFS = "scarcelab.sweep_refs"
#: how often the sweep was run (resumes)
SWEEP_INVOCATIONS = "scarcelab.sweep_invocations"
#: the sweep's scale: reference | smoke | full
SWEEP_SCALE = "scarcelab.sweep_scale"
#: the command line a cell ran
SWEEP_COMMAND = "scarcelab.sweep_command"
#: the digest of the sweep spec, so a resume refuses a changed spec
SWEEP_SPEC_DIGEST = "scarcelab.sweep_spec_digest"
#: the path of the sweep spec
SWEEP_SPEC_PATH = "scarcelab.sweep_spec_path"
#: the number of cells of the sweep
SWEEP_CELLS = "scarcelab.sweep_cells"
#: on the sweep run: what each cell was given (JSON: CPUs, GPUs, memory cap, threads, MPS)
SWEEP_RESOURCES = "scarcelab.sweep_resources"
#: the number of failed cells of the sweep
SWEEP_FAILED = "scarcelab.sweep_failed"
#: the machine of a cell run, as sub-tags ``.host .cpu .cores .ram_gb .gpu``
MACHINE = "scarcelab.machine"
#: the owner (host:pid) holding a sweep's lock
LOCK_OWNER = "scarcelab.lock_owner"
#: the lock holder's last heartbeat (unix time)
LOCK_HEARTBEAT = "scarcelab.lock_heartbeat"
#: the sweep a lock run guards
LOCK_SWEEP = "scarcelab.lock_sweep"

# --- tracker bookkeeping (``tracking/mlflow_tracker.py``, ``tracking/spool.py``) ----------
#: the process (host:pid:start) that owns a running run; a dead owner means a crashed run
OWNER = "scarcelab.owner"
#: "true" on a trial whose process died
CRASHED = "scarcelab.crashed"
#: the run that resumed this one
RESUMED_BY = "scarcelab.resumed_by"
#: the run this one resumed
RESUMED_FROM = "scarcelab.resumed_from"
#: on a tune_resume launcher run: the study run it resumes
RESUMES = "scarcelab.resumes"
#: the dead parent a trial run was moved from
MOVED_FROM = "scarcelab.moved_from"
#: why a checkpoint from the store was refused
CHECKPOINT_REFUSED = "scarcelab.checkpoint_refused"
#: the SHA-256 of a logged checkpoint, checked before it is loaded
CHECKPOINT_SHA256 = "scarcelab.checkpoint_sha256"
#: what reconciling a resumed study did to this trial
RECONCILED = "scarcelab.reconciled"
#: "true" on a run that a spool replay found still RUNNING after delivering its dead
#: writer's records, and so closed FAILED (reason in scarcelab.error); a resume reopens it
ENDED_BY_REPLAY = "scarcelab.ended_by_replay"
#: why the final model could not be exported
MODEL_EXPORT_ERROR = "scarcelab.model_export_error"
#: the saved model's format (logged model metadata, not a run tag): pt2
MODEL_FORMAT = "scarcelab.format"
# metadata of the logged raw-image model (tracking/pyfunc_model.py, MLmodel): what it takes,
# what it returns, the transform replayed on its inputs, the network's input shape
MODEL_INPUT = "scarcelab.input"
MODEL_OUTPUT = "scarcelab.output"
MODEL_TRANSFORM = "scarcelab.transform"
MODEL_NETWORK_INPUT = "scarcelab.network_input"
#: the client-chosen key that makes a spooled record's re-delivery idempotent
SPOOL_OP = "scarcelab.spool_op"
#: delivered_late: the run's records came from the spool after the process ended
SPOOL = "scarcelab.spool"
#: records the spool skipped (unreadable)
SPOOL_SKIPPED = "scarcelab.spool_skipped"
#: the number of spooled records that could not be delivered
RECORDS_LOST = "scarcelab.records_lost"
#: the number of trials whose records were lost
TRIALS_LOST = "scarcelab.trials_lost"
#: the number of epochs whose records were lost
EPOCHS_LOST = "scarcelab.epochs_lost"

# --- reports ------------------------------------------------------------------------------
#: the experiments a leaderboard report was built from, comma-separated
EXPERIMENTS = "scarcelab.experiments"


def note(key: str) -> str:
    """The tag of a dataset note (``DatasetBundle.notes`` / ``RawDataset.notes``): notes are
    open-ended facts about a copy of the data, so their names come from the dataset."""
    return PREFIX + key
