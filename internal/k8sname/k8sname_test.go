package k8sname

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestDNSNamesFollowDNS1123 ensures the DNS-1123 checks used for namespace and Lease names
// accept what the API server accepts and refuse the rest.
func TestDNSNamesFollowDNS1123(t *testing.T) {
	tests := []struct {
		name             string
		in               string
		label, subdomain bool
	}{
		{"NamespaceName", "team-a", true, true},
		{"DottedName", "cw.example.com", false, true},
		{"Empty", "", false, false},
		{"Uppercase", "Team", false, false},
		{"LeadingDash", "-a", false, false},
		{"TrailingDash", "a-", false, false},
		{"EmptyLabel", "a..b", false, false},
		{"LabelOf64", strings.Repeat("a", 64), false, false},
		{"SubdomainOf254", strings.Repeat("a.", 127), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.label, Label(tt.in) == nil, "label")
			assert.Equal(t, tt.subdomain, Subdomain(tt.in) == nil, "subdomain")
		})
	}
}
