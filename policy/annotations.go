package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"time"

	"github.com/k8spatterns/config-watcher/apiclient"
)

// RestartedForAnnotation is R in the state model
// (docs/design.md#state-model): the digest of the data every selected pod
// was last restarted for, or adopted.
const RestartedForAnnotation = "config-watcher.k8spatterns.io/restarted-for"

// RestartingAnnotation is I in the state model: "sha256:…/uid,uid,…", the
// digest a round restarts for and the pods it began with.
const RestartingAnnotation = "config-watcher.k8spatterns.io/restarting"

// HaltedAnnotation marks the round of the intent beside it halted:
// "<the intent's digest>@<RFC 3339 time it halted>". Written when the round
// halts, removed with the record that ends the round and by every new
// intent, it tells a controller that resumes the intent (after a restart or
// a failover) that the round halted, so it is halted at once. It counts only
// beside an intent for the same digest: a controller that knows nothing of
// it leaves it in place, and one that does ignores it there.
const HaltedAnnotation = "config-watcher.k8spatterns.io/halted"

// halt is HaltedAnnotation as read; zero is none.
type halt struct {
	hash digest
	at   time.Time
}

func (h halt) text() string { return h.hash.text() + "@" + h.at.UTC().Format(time.RFC3339) }

// textOrEmpty is the annotation's text, "" for no halt.
func (h halt) textOrEmpty() string {
	if h.hash.isZero() {
		return ""
	}
	return h.text()
}

// parseHalt reads the annotation; what cannot be read is no halt.
func parseHalt(v string) halt {
	text, at, _ := strings.Cut(v, "@")
	hash, ok := parseDigest(text)
	t, err := time.Parse(time.RFC3339, at)
	if !ok || err != nil {
		return halt{}
	}
	return halt{hash: hash, at: t}
}

// maxIntentPods bounds the intent's size (annotations may total 256 KiB).
// A larger round writes "*": every selected pod.
const maxIntentPods = 2000

// maxIntentText bounds what is kept of an intent read from the server:
// ours name at most maxIntentPods uids of 36 characters. A longer one (only
// a hand or a forger writes it) is read as naming no pods ("*"), so that
// each object's intent costs at most this much memory however many there
// are.
const maxIntentText = len(keyedDigestPrefix) + 2*sha256.Size + 1 + maxIntentPods*37

// digest is D, R or I's data: the SHA-256 of a ConfigMap's data
// (dataHash), or the HMAC-SHA256 of a Secret's (secretHash, keyed); zero is
// none.
type digest struct {
	sum [sha256.Size]byte
	// keyed: a Secret's. It is written only in the annotations of the
	// Secret's state ConfigMap (text), and shown nowhere else.
	keyed bool
}

const (
	digestPrefix      = "sha256:"
	keyedDigestPrefix = apiclient.KeyedDigestPrefix // apiclient hides them in what servers answer
)

// text is the annotation's form, "sha256:<64 hex digits>" or
// "hmac-sha256:<64 hex digits>", or "" for none.
func (d digest) text() string {
	switch {
	case d.isZero():
		return ""
	case d.keyed:
		return keyedDigestPrefix + hex.EncodeToString(d.sum[:])
	}
	return digestPrefix + hex.EncodeToString(d.sum[:])
}

// String is the form for logs: the annotation's form, or nothing of a
// Secret's data.
func (d digest) String() string {
	if d.keyed {
		return "(not shown: Secret data)"
	}
	return d.text()
}

// MarshalText gives String to encoding/json and log/slog.
func (d digest) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d digest) isZero() bool { return d.sum == [sha256.Size]byte{} }

// textOrEmpty is the annotation's text, "" for no digest.
func (d digest) textOrEmpty() string {
	if d.isZero() {
		return ""
	}
	return d.text()
}

// parseDigest reads the annotation's form. The all-zero digest (only a hand
// edit writes it) is not one.
func parseDigest(s string) (digest, bool) {
	var d digest
	text, ok := strings.CutPrefix(s, digestPrefix)
	if !ok {
		text, d.keyed = strings.CutPrefix(s, keyedDigestPrefix)
	}
	if (!ok && !d.keyed) || len(text) != hex.EncodedLen(len(d.sum)) {
		return digest{}, false
	}
	if _, err := hex.Decode(d.sum[:], []byte(text)); err != nil {
		return digest{}, false
	}
	return d, !d.isZero()
}

// intent is RestartingAnnotation as read.
type intent struct {
	text string // "" for none; at most maxIntentText bytes
	hash digest
	all  bool // "*": the round's pods are not named
}

func (in intent) present() bool { return in.text != "" }

// uids returns the pods the intent names (nil if it names none: all). A
// round that resumes the intent asks once; nothing else needs them, so
// entries keep only the text.
func (in intent) uids() map[string]bool {
	if in.all || !in.present() {
		return nil
	}
	_, list, _ := strings.Cut(in.text, "/")
	uids := map[string]bool{}
	for uid := range strings.SplitSeq(list, ",") {
		if uid != "" {
			uids[uid] = true
		}
	}
	return uids
}

// groups returns the pods the intent names by owner, as newIntent wrote
// them: one group for an intent that does not tell (one owner, or written
// by a version before the groups). A round that resumes it asks once.
func (in intent) groups() [][]string {
	if in.all || !in.present() {
		return nil
	}
	_, list, _ := strings.Cut(in.text, "/")
	var groups [][]string
	for group := range strings.SplitSeq(list, ",,") {
		var uids []string
		for uid := range strings.SplitSeq(group, ",") {
			if uid != "" {
				uids = append(uids, uid)
			}
		}
		if len(uids) > 0 {
			groups = append(groups, uids)
		}
	}
	return groups
}

// newIntent names pods, those of one owner together, the groups apart by
// an empty entry ("a,b,,c"): a resumed round owes a pod gone only to the
// owner of the pods shown beside it (oweResumed), and a reader that knows
// no groups (every version before them) skips the empty entry and reads
// the same pods. Grouped only while that reader's bound on entries holds.
func newIntent(hash digest, pods []podRef) intent {
	uids := "*"
	if len(pods) <= maxIntentPods {
		var order []string // owners, as their pods come first
		byOwner := map[string][]string{}
		for _, p := range pods {
			if _, ok := byOwner[p.ownerUID]; !ok {
				order = append(order, p.ownerUID)
			}
			byOwner[p.ownerUID] = append(byOwner[p.ownerUID], p.uid)
		}
		sep := ",,"
		if len(pods)+len(order)-2 >= maxIntentPods {
			sep = ","
		}
		groups := make([]string, len(order))
		for i, owner := range order {
			groups[i] = strings.Join(byOwner[owner], ",")
		}
		uids = strings.Join(groups, sep)
	}
	return parseIntent(hash.text() + "/" + uids)
}

// mixedIntent is the intent a round leaves beside its record when the data
// was seen to differ from its own while it ran (only a round begun in a
// storm goes on then: storm.go). Its replacements created meanwhile may run
// any data seen, whatever the data is now, even R's. It names no data, so
// that the next round, whatever the data, is over every selected pod: a
// controller before it reads it so too, as an intent that cannot be read.
var mixedIntent = parseIntent("mixed/*")

// parseIntent reads the annotation. One that cannot be read is still an
// intent, for no data: a round was cut short, and its pods are mixed. One
// longer than maxIntentText, or naming more than maxIntentPods pods, names
// none ("*"); its text is then its digest's form, or a fingerprint.
func parseIntent(v string) intent {
	if v == "" {
		return intent{}
	}
	text, list, _ := strings.Cut(v, "/")
	in := intent{text: v}
	in.hash, _ = parseDigest(text)
	in.all = list == "*" || len(v) > maxIntentText || strings.Count(list, ",") >= maxIntentPods
	if len(v) > maxIntentText {
		in.text = in.hash.text() + "/*"
		if in.hash.isZero() {
			sum := sha256.Sum256([]byte(v))
			in.text = "unreadable/" + hex.EncodeToString(sum[:8])
		}
	}
	return in
}
