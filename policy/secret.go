package policy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
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
// controller holds (Config.DigestKey): whoever may read ConfigMaps cannot
// test guesses of a low-entropy value against it, as they could against a
// plain digest. The key's id is written beside them: state written under
// another key cannot be compared, and the Secret is adopted as it is.

// StateOfSecretAnnotation marks a state ConfigMap and names its Secret.
const StateOfSecretAnnotation = "config-watcher.k8spatterns.io/state-of-secret"

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

// secretHash digests a Secret's data as dataHash does a ConfigMap's (keys
// sorted, length-prefixed), over the decoded bytes of each value, with
// HMAC-SHA256 under key: the same bytes give the same digest however they
// were written (data, stringData). TestSecretHashIsPinned pins it: records
// written earlier must keep matching.
func secretHash(key []byte, data gjson.Result) digest {
	h := hmac.New(sha256.New, key)
	writeSection(h, "data", data, writeDecoded)
	return digest{sum: [sha256.Size]byte(h.Sum(nil)), keyed: true}
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

// fromStateConfigMap reads a state ConfigMap's view for its Secret. State
// written under another key is not R or I for this one: R is dropped (the
// Secret is adopted), and I stands for no data (its pods are mixed).
func (c *Controller) fromStateConfigMap(obj object) stored {
	st := obj.stored
	if obj.keyID != c.keyID {
		st.recorded = digest{}
		st.intent.hash = digest{}
	}
	return st
}

// writeSecretState writes annotations (R or I; nil removes one) on the
// Secret's state ConfigMap, creating it the first time, and returns the
// revision the server answered. The ConfigMap is owned by the Secret: the
// garbage collector removes it with the Secret.
func (c *Controller) writeSecretState(ctx context.Context, obj object, annotations map[string]any) (uint64, error) {
	annotations[StateOfSecretAnnotation] = obj.name
	annotations[DigestKeyIDAnnotation] = c.keyID
	meta := map[string]any{
		"labels":      map[string]string{managedByLabel: "config-watcher"},
		"annotations": annotations,
		"ownerReferences": []map[string]string{
			{"apiVersion": "v1", "kind": "Secret", "name": obj.name, "uid": obj.uid},
		},
	}
	path := apiclient.CorePath(obj.namespace, "configmaps", stateName(obj.name))
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return 0, err
	}
	answer, err := c.api.MergePatch(ctx, path, patch)
	if classify(err) == answerGone {
		// The first write, or the state ConfigMap was deleted.
		for a, v := range annotations {
			if v == nil {
				delete(annotations, a)
			}
		}
		meta["name"] = stateName(obj.name)
		body, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})
		if err != nil {
			return 0, err
		}
		answer, err = c.api.Create(ctx, apiclient.CorePath(obj.namespace, "configmaps", ""), body)
		if classify(err) == answerConflict {
			// Created meanwhile (by another replica's last term).
			answer, err = c.api.MergePatch(ctx, path, patch)
		}
		if err != nil {
			return 0, err
		}
	} else if err != nil {
		return 0, err
	}
	return gjson.GetBytes(answer, "metadata.resourceVersion").Uint(), nil
}
