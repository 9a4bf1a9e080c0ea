// Package policy decides and carries out pod restarts for ConfigMap data
// changes: it observes ConfigMaps (as a watch.Handler), decides whether the
// pods a ConfigMap selects run its current data, and restarts the ones that
// may not, so that their controllers recreate them.
//
// # State model
//
// Per annotated ConfigMap, three values decide everything (docs/design.md
// says the same at more length):
//
//   - D, the digest of the data now (configMap.hash);
//   - R, RestartedForAnnotation: every selected pod runs R, unless a round
//     is in progress;
//   - I, RestartingAnnotation: a round for I.hash began over the pods it
//     names; pods created after it began run I.hash. It is written before
//     the round's first restart and removed with the record that ends it.
//
// With RECORD_HASH=false (or in a dry run) R and I live in memory only.
// decide (state.go) maps them to one step:
//
//	state                                    step
//	a round for D runs here                  continue it (retries delete only what is left)
//	I for D, not outdated                    resume: restart the pods I names that still exist
//	I for other data, or outdated            new round over every selected pod: pods are mixed
//	no R, no I (first sight)                 adopt: record D, restart nothing
//	R = D, no I                              nothing (write R if the annotation is missing)
//	R ≠ D, no I                              new round over every selected pod
//
// A round writes I, restarts, then writes R = D and removes I. Interrupted
// anywhere, it leaves a state of the table, and the next look resolves it:
// killed mid-round leaves I (resumed, or a new round if the data moved
// on); a failed record leaves I too; a lost lease stops the round before its
// next write, and the new leader finds I. An intent is outdated once the data
// was seen to differ from I.hash after it was written: the pods created
// meanwhile ran that other data, so data set back to I.hash does not
// resume it. A round in memory is dropped as soon as an event shows other
// data, or an R or I written by someone else, and a worker checks before
// every restart that its round is still the current one.
//
// The pod index (sweep.go) only makes a round start sooner. Pods taken
// from it are deleted with uid and resourceVersion preconditions, so a
// stale index makes the server refuse (409) instead of deleting a pod that
// no longer matches; such a pod goes through the LIST of the sweep.
package policy
