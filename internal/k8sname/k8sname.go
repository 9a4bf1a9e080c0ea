// Package k8sname checks Kubernetes object names by the rules of
// k8s.io/apimachinery/pkg/util/validation: the settings name namespaces and
// a Lease, and a label key's prefix is a DNS subdomain too.
package k8sname

import (
	"errors"
	"fmt"
	"regexp"
)

const dnsLabel = `[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?`

var (
	labelRE     = regexp.MustCompile(`^` + dnsLabel + `$`)
	subdomainRE = regexp.MustCompile(`^` + dnsLabel + `(\.` + dnsLabel + `)*$`)
)

// Label checks a DNS-1123 label, such as a namespace name.
func Label(s string) error {
	if !labelRE.MatchString(s) {
		return fmt.Errorf("%q is not a DNS-1123 label (1 to 63 lowercase letters, digits and '-', starting and ending alphanumeric)", s)
	}
	return nil
}

// MaxSubdomain is the longest DNS-1123 subdomain, and so the longest
// object name.
const MaxSubdomain = 253

// Subdomain checks a DNS-1123 subdomain, such as a Lease name or a key's
// prefix: DNS-1123 labels joined by '.', at most 253 bytes.
func Subdomain(s string) error {
	switch {
	case s == "":
		return errors.New("is empty")
	case len(s) > MaxSubdomain:
		return fmt.Errorf("longer than %d characters", MaxSubdomain)
	case !subdomainRE.MatchString(s):
		return fmt.Errorf("%q is not a DNS-1123 subdomain (lowercase letters, digits, '-', '.')", s)
	}
	return nil
}
