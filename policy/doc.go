// Package policy decides and carries out pod restarts for ConfigMap and
// Secret data changes: it observes them (its scopes are watch.Handlers), and
// restarts the pods one selects when they may not run its current data, so
// that their controllers recreate them. docs/design.md explains it at
// length; its state model (the table of states and steps, and how each
// interrupted state resolves) is the one copy, which decide (state.go)
// follows row by row.
//
// # Two halves
//
// Observing (observe.go, state.go, object.go, annotations.go): the watches'
// handlers keep one entry per annotated object, the view of it and of its
// R and I, tombstones, and the state of Secrets; they never call the API,
// and queue the keys that may need action. The pod index (podindex) is an
// observer too: it keeps the live view of the pods every wave decides
// from, and tells podChanged (waves.go) of readiness changes, which queues
// the keys of the rounds that select the pod. Acting (workers.go, queue.go,
// round.go, waves.go, budget.go, owners.go, restart.go, sweep.go, pods.go,
// errors.go): workers take keys, read the entry under the lock, and write
// to the API. secret.go holds both sides for Secrets.
//
// # Who owns what
//
// One owner per piece of state, as in client-go's workqueue: observers
// record what they saw and queue a key; they never change what a worker
// holds.
//
//	state                                   owner, and how others reach it
//	Controller.entries, states, tombstones  c.mu: handlers write views
//	entry.obj, r, i, outdated, sawOther,    (apply, the one judge of our writes
//	adopted, written, writing, ourIntent,   against others', which returns a
//	ended, tookIntent                       verdict and sets ended); workers
//	                                        write what their writes left
//	                                        (writeState), under c.mu
//	entry.changes, seenAt, mark             observers (takeView), under c.mu;
//	                                        a refused change's mark: its
//	                                        worker (markRefused), under c.mu;
//	                                        a mark's rv: its LIST's goroutine
//	                                        until done is closed (mark.go)
//	entry.storm, stormRound; c.storms;      the worker of the key (judgeStorm,
//	round.storm                             stormGate, endStormHold), under
//	                                        c.mu; endTerm
//	entry.round (the pointer)               the worker of the key (beginRound,
//	                                        reconcile, record); Lead's endTerm
//	                                        once every worker has returned
//	round.key, hash, keys, selector, sel,   set once: anyone, under c.mu
//	overMixed
//	round.pods, resumed, progress,          the worker of the key alone
//	halted, haltFound, next, token,
//	tokenAt, indexed
//	(its index, swept, listOnly,
//	bound)
//	indexed.answered, deleted               its mu: restart goroutines note
//	                                        their deletions
//	boundList.rv, err                       its LIST's goroutine, until done
//	                                        is closed; then the worker
//	round.state[i]                          the goroutine restarting pods[i],
//	                                        joined before the worker reads it
//	round.listed, mostSeen, live,           the namespace budget's lock: other
//	estimate, unanswered, allowed;          rounds' waves count this one's budget
//	namespaceBudget.inFlight, deletions,    (restart goroutines note deletions)
//	counts, firstSeen
//	round.blocked, firstRestart, sent       atomic: restart goroutines
//	owners (scale reads, discovery)         its own lock (after c.mu or the
//	                                        budget's); kept while a round
//	                                        that asked is in progress
//	                                        (forget, after each reconcile)
//	the pods (podindex.Index)               its own lock; the watch writes,
//	                                        rounds read copies (View); its
//	                                        OnChange runs outside it, and
//	                                        takes c.mu, then the queue's
//	queue                                   its own lock (after c.mu)
//
// # Where each state resolves
//
//	which round is current      current (round.go), asked right before every
//	                            write request, after its waits
//	ours or theirs              entry.apply (state.go): an older view is our
//	                            write's past; our own write's event (writing,
//	                            ourIntent) is ours; our intent gone with no
//	                            record is a wipe (written again: needsIntent);
//	                            anything else is theirs, and ends a round
//	an ended round              reconcile lets it go, at its worker's next look
//	an answer to a write        classify (errors.go), the one error table; a
//	                            404 or 409 on the state supersedes only once an
//	                            event shows the object replaced (writeState)
//	a restart refused 409       restartPod (restart.go): re-read by name, retried
//	                            only if still selected, the same uid and not
//	                            terminating; else left
//	an intent superseded        entry.letGo (state.go), by reconcile: removed
//	                            if the round sent no restart and no pod
//	                            was created since it took its pods (mixed/*
//	                            if it began over mixed pods: undoIntent)
//	a standby                   queue.go: queues nothing; endTerm lets rounds go;
//	                            Lead queues what needs action
//	a storm                     judgeStorm (storm.go), by the key's worker: at
//	                            most one round per StormWindow, not superseded
//	                            by data changes until the storm ends or it
//	                            halts (endStormHold); restartTokens paces
//	                            restarts
//	a round's pods              take (waves.go) from its first view; from the
//	                            index, completed once it has caught up to the
//	                            bound, or by one sweep LIST (complete, sweep.go)
//	a round waiting for Ready   wave (waves.go) and choose: the budget
//	                            (budget.go) on the index's view (a LIST where
//	                            none watches), decided under the namespace's
//	                            lock, no request sent under it; woken by
//	                            podChanged and nextLook; halted after
//	                            ProgressDeadline it is marked so on the object
//	                            (writeHalt), keeps I and goes on, frozen while
//	                            its replacements are not available
package policy
