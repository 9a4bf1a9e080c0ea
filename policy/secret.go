package policy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"

	"github.com/tidwall/gjson"

	"github.com/k8spatterns/config-watcher/apiclient"
	"github.com/k8spatterns/config-watcher/internal/k8sname"
)

// A Secret's state (R and I) lives in a state ConfigMap beside it, never on
// the Secret itself: operators that own Secrets (External Secrets, Sealed
// Secrets, cert-manager, a GitOps replace) write them whole and drop
// annotations they do not know. State on the Secret would be lost with a
// change made while the controller was down, or written back after every
// sync, a ping-pong with the owner. Nothing is ever written on a Secret.
//
// R and I name the Secret's data by an HMAC-SHA256 under a key only the
// controller holds (Config.DigestKey), derived for each namespace and over
// the Secret's namespace and name with its data: whoever may read
// ConfigMaps cannot test guesses of a low-entropy value against it, nor
// plant a Secret of their own to compare with, and equal Secrets show
// different digests. The state carries a MAC under the same namespace key
// over the Secret's namespace and name, R (its key digests too), I and the
// halt (stateMAC): one who may write ConfigMaps cannot forge a record or an
// intent that the controller would act on.
//
// A state ConfigMap's view is used only if it is ours (stateIsOurs: under
// our key, its MAC checks), and not at all otherwise: an intent that
// cannot be authenticated would be a licence to restart on demand, and a
// record one to suppress a restart. The Secret is then adopted as it is
// now (its adoption writes our state over the view), its pods are
// restarted at its next change, and a StateUntrusted Warning Event says so.
// A state ConfigMap is written only through its uid once a view or an
// answer showed it as ours (our label and a Secret owner of its name), and
// created otherwise: a ConfigMap of that name that is not ours is never
// written (errForeignState).

// StateOfSecretAnnotation marks a state ConfigMap and names its Secret.
const StateOfSecretAnnotation = "config-watcher.k8spatterns.io/state-of-secret"

// StateMACAnnotation authenticates a state ConfigMap's state (stateMAC).
const StateMACAnnotation = "config-watcher.k8spatterns.io/state-mac"

// DigestKeyIDAnnotation names the key a state ConfigMap's digests were
// made with (keyID).
const DigestKeyIDAnnotation = "config-watcher.k8spatterns.io/digest-key-id"

// stateNamePrefix begins the name of every state ConfigMap.
const stateNamePrefix = "config-watcher-secret."

// managedByLabel marks the state ConfigMaps, for people listing them.
const managedByLabel = "app.kubernetes.io/managed-by"

// MinDigestKey is the shortest digest key accepted: SHA-256's block of
// security.
const MinDigestKey = 32

// stateName is the name of a Secret's state ConfigMap. A name too long to
// carry the prefix is replaced by a digest of it (names are not secret).
func stateName(secret string) string {
	if name := stateNamePrefix + secret; len(name) <= k8sname.MaxSubdomain {
		return name
	}
	sum := sha256.Sum256([]byte(secret))
	return stateNamePrefix + hex.EncodeToString(sum[:8])
}

// keyIDBytes is the length of a key id, before its hex encoding.
const keyIDBytes = 4

// keyID names a digest key without telling anything of it.
func keyID(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("config-watcher digest key id"))
	return hex.EncodeToString(m.Sum(nil)[:keyIDBytes])
}

// namespaceKey derives the key of one namespace's digests and MACs from
// the digest key: a digest of one namespace says nothing of another's.
func namespaceKey(key []byte, namespace string) []byte {
	m := hmac.New(sha256.New, key)
	writeString(m, "config-watcher namespace key")
	writeString(m, namespace)
	return m.Sum(nil)
}

// secretHash digests a Secret's data as dataHash does a ConfigMap's (keys
// sorted, length-prefixed), over the decoded bytes of each value, with
// HMAC-SHA256 under the namespace's key, after the Secret's namespace and
// name: the same bytes give the same digest however they were written
// (data, stringData), and only for this Secret. TestSecretHashIsPinned pins
// it: records written earlier must keep matching.
func secretHash(key []byte, namespace, name string, data gjson.Result) digest {
	h := hmac.New(sha256.New, namespaceKey(key, namespace))
	writeString(h, namespace)
	writeString(h, name)
	writeSection(h, "data", data, writeDecoded)
	return digest{sum: [sha256.Size]byte(h.Sum(nil)), keyed: true}
}

// stateMAC authenticates a Secret's state as a state ConfigMap holds it:
// the Secret's namespace and name, R, I and the halt, each as written (""
// when absent), then R's key digests where it has any. TestStateMACIsPinned
// pins it.
func stateMAC(key []byte, namespace, secret string, st stored) string {
	m := hmac.New(sha256.New, namespaceKey(key, namespace))
	writeString(m, "config-watcher state")
	writeString(m, namespace)
	writeString(m, secret)
	writeString(m, st.recorded.textOrEmpty())
	writeString(m, st.intent.text)
	writeString(m, st.halted.textOrEmpty())
	if st.recordedKeys != "" {
		// Only where there are any, so that the MACs of states written
		// before key digests existed still check.
		writeString(m, string(st.recordedKeys))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// writeDecoded writes a base64 value decoded; anything else (the API never
// serves it) as raw text, tagged apart.
func writeDecoded(h hash.Hash, v gjson.Result) {
	if v.Type == gjson.String {
		if b, err := base64.StdEncoding.DecodeString(v.String()); err == nil {
			h.Write([]byte{'b'})
			writeUint(h, uint64(len(b)))
			h.Write(b)
			return
		}
	}
	h.Write([]byte{'r'})
	writeString(h, v.Raw)
}

// stateIsOurs: a state ConfigMap's view was written by this controller
// under its key (its MAC checks).
func (c *Controller) stateIsOurs(obj object) bool {
	return obj.keyID == c.keyID && hmac.Equal([]byte(obj.mac), []byte(stateMAC(c.cfg.DigestKey, obj.namespace, obj.stateOf, obj.stored)))
}

// fromStateConfigMap reads a state ConfigMap's view for its Secret: all of
// it if it is ours, nothing otherwise.
func fromStateConfigMap(obj object, ours bool) stored {
	st := obj.stored
	if !ours {
		st.recorded, st.recordedKeys, st.intent, st.halted = digest{}, "", intent{}, halt{}
	}
	return st
}

// errForeignState: a ConfigMap holds the name of a Secret's state and is
// not ours. It is never written; a person renames or deletes it.
var errForeignState = errors.New("a ConfigMap of this name exists and is not config-watcher's state of the Secret (no app.kubernetes.io/managed-by=config-watcher label and Secret owner): rename or delete it")

// writeSecretState writes st, the whole state after a write, on the
// Secret's state ConfigMap with its MAC, and returns the revision and uid
// the server answered. It patches the ConfigMap through holder, the uid a
// view or an answer showed ours, so that another ConfigMap of the name is
// refused (a changed uid is a conflict); without one it creates it, and if
// one exists, takes it only once a view shows it ours. The ConfigMap is
// owned by the Secret: the garbage collector removes it with the Secret.
// may is the writer's check, asked again before the patch that follows a
// wait for a view.
func (c *Controller) writeSecretState(ctx context.Context, obj object, holder string, st stored, may func() error) (uint64, string, error) {
	name := stateName(obj.name)
	annotations := map[string]any{
		StateOfSecretAnnotation:    obj.name,
		DigestKeyIDAnnotation:      c.keyID,
		StateMACAnnotation:         stateMAC(c.cfg.DigestKey, obj.namespace, obj.name, st),
		RestartedForAnnotation:     orNil(st.recorded.textOrEmpty()),
		RestartedForKeysAnnotation: orNil(string(st.recordedKeys)),
		RestartingAnnotation:       orNil(st.intent.text),
		HaltedAnnotation:           orNil(st.halted.textOrEmpty()),
	}
	meta := map[string]any{
		"labels":      map[string]string{managedByLabel: "config-watcher"},
		"annotations": annotations,
		"ownerReferences": []map[string]string{
			{"apiVersion": "v1", "kind": "Secret", "name": obj.name, "uid": obj.uid},
		},
	}
	patch := func(uid string) ([]byte, error) {
		meta["uid"] = uid
		body, err := json.Marshal(map[string]any{"metadata": meta})
		if err != nil {
			return nil, err
		}
		return c.api.MergePatch(ctx, apiclient.CorePath(obj.namespace, "configmaps", name), body)
	}
	create := func() ([]byte, error) {
		created := map[string]any{"name": name}
		for k, v := range meta {
			created[k] = v
		}
		// Nothing to remove in a create; the patch that follows a refused
		// one still removes them (meta's map is left as it is).
		held := map[string]any{}
		for a, v := range annotations {
			if v != nil {
				held[a] = v
			}
		}
		created["annotations"] = held
		body, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": created})
		if err != nil {
			return nil, err
		}
		return c.api.Create(ctx, apiclient.CorePath(obj.namespace, "configmaps", ""), body)
	}
	var answer []byte
	var err error
	if holder != "" {
		answer, err = patch(holder)
	}
	if holder == "" || classify(err) == answerNotFound {
		answer, err = create()
	}
	if classify(err) == answerConflict {
		// The name holds another ConfigMap than the one we held: ours,
		// created by another replica's last term (a view shows it), or
		// someone else's.
		if ours := c.waitStateHolder(ctx, obj, holder); ours != "" {
			if err := may(); err != nil {
				return 0, "", err
			}
			answer, err = patch(ours)
		} else {
			err = fmt.Errorf("ConfigMap %s/%s: %w", obj.namespace, name, errForeignState)
		}
	}
	if err != nil {
		return 0, "", err
	}
	return gjson.GetBytes(answer, "metadata.resourceVersion").Uint(), gjson.GetBytes(answer, "metadata.uid").String(), nil
}

// waitStateHolder returns the uid of the Secret's state ConfigMap as a
// view shows it ours, other than refused, waiting up to c.replacedWait for
// one; "" if none. Once a wait found none, the next ones do not wait until
// a view of the Secret's state comes (observeState): a ConfigMap of the
// name that is not ours (someone else's, or the state of a Secret of the
// name before, while no garbage collector has removed it) would hold a
// worker that long on every retry, and every other object's round behind
// it. A view of ours that comes later is taken by the retry.
func (c *Controller) waitStateHolder(ctx context.Context, obj object, refused string) string {
	key := obj.key()
	c.mu.Lock()
	wait := c.replacedWait
	if e := c.entries[key]; e != nil && e.stateRefused {
		wait = 0
	}
	c.mu.Unlock()
	var uid string
	found := c.waitFor(ctx, wait, func() bool {
		if s := c.states[key]; s != nil && s.st.holder != refused {
			uid = s.st.holder
		}
		return uid != ""
	})
	c.mu.Lock()
	if e := c.entries[key]; e != nil {
		e.stateRefused = !found && ctx.Err() == nil
	}
	c.mu.Unlock()
	return uid
}

// orNil is v, or nil (a removal in a merge patch) when it is empty.
func orNil(v string) any {
	if v == "" {
		return nil
	}
	return v
}
