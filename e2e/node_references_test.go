//go:build e2e && e2enode

package e2e

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestNodeReferencingPodsServeTheNewMessage is the demo with
// restartReferencingPods in place of the selector, on the real kubelet:
// the webapp reads webapp-config's message, so changing it replaces each
// webapp pod once, the new pods serve the new message, and not one request
// sent to a ready endpoint of the Service fails meanwhile.
func TestNodeReferencingPodsServeTheNewMessage(t *testing.T) {
	requireNode(t)
	selector := getConfigMap(t, nodeNS, wavesConfigMap).Metadata.Annotations[selectorAnnotation]
	kubectl(t, "annotate", "configmap", wavesConfigMap, "-n", nodeNS, selectorAnnotation+"-", referencingAnnotation+"=true")
	t.Cleanup(func() {
		kubectl(t, "annotate", "configmap", wavesConfigMap, "-n", nodeNS, "--overwrite", referencingAnnotation+"-", selectorAnnotation+"="+selector)
	})
	old := waitReadyPods(t, webappSel, 2)
	before := getConfigMap(t, nodeNS, wavesConfigMap).Data["message"]
	sampler := sampleReady(t, old)
	client := startSliceClient(t, "webapp", 2)

	message := "referenced " + randomSuffix()
	mergePatch(t, nodeNS, wavesConfigMap, fmt.Sprintf(`{"data":{"message":%q}}`, message))
	eventually(t, nodeTimeout, "2 Ready webapp pods, none old, none terminating", func() (bool, string) {
		return sampler.settled(2)
	})
	checkAnswers(t, client, before, message)
	for name, n := range oldDeletes(t, old) {
		assert.Equal(t, 1, n, "deletions of %s by %s", name, nodeSA)
	}
	for name, body := range serve(t, nodePods(t, webappSel)) {
		assert.Equal(t, message, body, "pod %s after the change", name)
	}
}
