package server

import (
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
)

type sizeJSON struct {
	Name           string `json:"name"`
	VCPUs          int    `json:"vcpus"`
	MemoryMiB      int    `json:"memoryMiB"`
	DiskMiB        int    `json:"diskMiB"`
	EgressMiB      int64  `json:"egressMiB"`
	CreditsPerHour amount `json:"creditsPerHour"`
	// Allowed says whether the caller's plan may run it (else 403).
	Allowed bool `json:"allowed"`
}

// listSizes: GET /v1/sizes, the size table with each size's resources,
// credit rate and whether the caller's organization's plan allows it (a
// size picker needs all three).
func (s *Server) listSizes(c *gin.Context) {
	pl, _, err := s.sessions.OrgPlan(c.Request.Context(), principal(c).Org.ID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := make([]sizeJSON, 0, len(s.cfg.Sizes.List))
	for _, z := range s.cfg.Sizes.List {
		out = append(out, sizeJSON{Name: z.Name, VCPUs: z.VCPUs, MemoryMiB: z.MemoryMiB, DiskMiB: z.DiskMiB,
			EgressMiB: z.EgressMiB, CreditsPerHour: amountOf(z.CreditsPerHour), Allowed: pl.Allows(s.cfg.Sizes, z)})
	}
	legacy := s.cfg.Sizes.Legacy
	if legacy == nil {
		legacy = map[string]string{}
	}
	c.JSON(http.StatusOK, gin.H{"default": s.cfg.Sizes.Default, "sizes": out, "legacy": legacy, "plan": pl.Name})
}

// statsJSON is GET /v1/sandbox/:sessionId/stats; a figure the host does
// not expose is null.
type statsJSON struct {
	Memory struct {
		UsedBytes  *int64 `json:"usedBytes"`
		LimitBytes *int64 `json:"limitBytes"`
	} `json:"memory"`
	CPU struct {
		Seconds *float64 `json:"seconds"`
		VCPUs   int      `json:"vcpus"`
	} `json:"cpu"`
	Pids struct {
		Current *int64 `json:"current"`
		Limit   *int64 `json:"limit"`
	} `json:"pids"`
	Disk struct {
		UsedBytes  *int64 `json:"usedBytes"`
		TotalBytes *int64 `json:"totalBytes"`
	} `json:"disk"`
	Time time.Time `json:"time"`
}

func known(n int64) *int64 {
	if n < 0 {
		return nil
	}
	return &n
}

// getStats: GET /v1/sandbox/:sessionId/stats, a running sandbox's current
// memory, CPU time, processes and disk, as the host counts them (gVisor's
// own share included).
func (s *Server) getStats(c *gin.Context) {
	ses, ok := s.sessionFor(c)
	if !ok {
		return
	}
	u, err := s.sessions.ResourceUse(*ses)
	if err != nil {
		s.writeError(c, err)
		return
	}
	var out statsJSON
	out.Memory.UsedBytes, out.Memory.LimitBytes = known(u.MemoryBytes), known(u.MemoryLimit)
	if u.CPU >= 0 {
		sec := u.CPU.Seconds()
		out.CPU.Seconds = &sec
	}
	out.CPU.VCPUs = ses.VCPUs
	out.Pids.Current, out.Pids.Limit = known(u.Pids), known(u.PidsLimit)
	out.Disk.UsedBytes, out.Disk.TotalBytes = known(u.DiskUsed), known(u.DiskTotal)
	out.Time = time.Now().UTC()
	c.JSON(http.StatusOK, out)
}
