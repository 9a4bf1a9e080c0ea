// Package compose checks docker-compose.yaml offline, with no Docker engine and no
// Docker Compose build, in a module of its own so that the controller's go.mod stays
// small. It loads the file with compose-go (github.com/compose-spec/compose-go/v2),
// the Compose specification's own loader and the one Docker Compose uses: schema,
// interpolation, profiles and depends_on, for the default profile and for the
// profile sandbox. Then it checks what the schema cannot know:
//
//   - `docker compose up` without a profile starts the controller alone;
//   - the controller is hardened (non-root, read-only, no capabilities,
//     no-new-privileges, not privileged) and reaches the ambassador through the
//     host network at http://localhost:8001, serving its own port on loopback;
//   - the sandbox has its services, in order, publishes only the ambassador and
//     only on the host's loopback, and runs the kubectl image manifests/ deploys;
//   - the bash scripts of the one-shot services parse (bash -n) and pass shellcheck.
//
// Each check has a case that must be reported (TestEveryCheckHasAViolation).
//
// It has no code of its own besides its tests: `make compose-check`.
package compose
