// Package sim is the deterministic simulation of config-watcher: the real
// controller, wired as the program wires it (internal/app.Run), against an
// in-memory cluster inside one testing/synctest bubble, where one seed
// chooses every outside event, every fault and the order in which pending
// requests are answered. Invariants are read from the cluster's ground
// truth only (what data each pod started with, every deletion the server
// accepted), never from the controller's annotations, logs or metrics.
//
// Everything is in its tests; CONTRIBUTING.md ("The simulator") says how to
// run, replay and extend it.
package sim
