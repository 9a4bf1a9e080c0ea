// Package policy decides and carries out pod restarts for ConfigMap and
// Secret data changes: it observes them (its scopes are watch.Handlers), and
// restarts the pods one selects when they may not run its current data, so
// that their controllers recreate them. docs/design.md explains it at length.
//
// # Two halves
//
// Observing (observe.go, state.go, object.go, annotations.go): the watches'
// handlers keep one entry per annotated object, the view of it and of its
// R and I, tombstones, and the state of Secrets; they never call the API,
// and queue the keys that may need action. Acting (workers.go, queue.go,
// round.go, waves.go, budget.go, owners.go, restart.go, sweep.go, pods.go,
// errors.go): workers
// take keys, read the entry under the lock, and write to the API; what a
// write changes goes back into the entry through the one rule of
// entry.wrote and entry.apply. secret.go holds both sides for Secrets.
//
// # State model
//
// Per annotated ConfigMap or Secret, three values decide everything: D, the
// digest of the data now; R (RestartedForAnnotation), the data every
// selected pod runs unless a round is in progress; I (RestartingAnnotation),
// a round for I.hash that began over the pods it names (pods created after
// it began run I.hash). A ConfigMap carries R and I itself; a Secret's live
// in its state ConfigMap (secret.go), never on the Secret. With
// RECORD_HASH=false or in a dry run, R and I live in memory only. decide
// (state.go) maps them to one step:
//
//	state                                    step
//	a Secret's state ConfigMap not listed    nothing yet: its absence may only be late
//	a round for D runs here                  continue it (retries restart only what is left; I again if wiped)
//	I for D, not outdated                    resume: restart the pods I names that still exist
//	I for other data, or outdated            new round over every selected pod: pods are mixed
//	no R, no I (first sight)                 adopt: record D, restart nothing
//	R = D, no I                              nothing (write R once if the annotation is missing)
//	R ≠ D, no I                              new round over every selected pod
//
// A round (round.go) writes I, restarts in waves that wait for Ready pods
// (waves.go), then writes R = D and removes I.
// Interrupted anywhere, it leaves a state of the table: killed mid-round or
// failing to record, it leaves I; a lost lease stops it before its next
// write. I is outdated once the data was seen to differ from I.hash after I
// was written: pods created meanwhile ran that other data.
//
// How each state resolves, in one place each:
//
//	which round is current      current (round.go), asked before every write
//	an answer to a write        classify (errors.go), the one error table
//	our writes against others'  entry.apply and entry.wrote (state.go): an
//	                            event older than our last write is its past;
//	                            a newer one without our I during a round is a
//	                            wipe (the object replaced): I is written again
//	a restart refused 409       restartPod (restart.go): re-read by name, retried
//	                            only if still selected, the same uid and not
//	                            terminating; else left
//	an intent superseded        writeIntent: removed if the round restarted
//	                            nothing yet
//	a standby                   queue.go: queues nothing; Lead queues what needs
//	                            action
//	a round waiting for Ready   wave (waves.go) and choose: the budget
//	                            (budget.go) counted on a fresh LIST of the
//	                            namespace each wave, restarts in flight counted;
//	                            halted after ProgressDeadline, it keeps I and
//	                            goes on, frozen while its replacements are not
//	                            available; a new change supersedes it
package policy
