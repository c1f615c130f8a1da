package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/server/config"
	"sandboxd/server/credits"
	"sandboxd/server/errdefs"
	"sandboxd/store"
)

// Usage and plans at the edge: GET /v1/usage for an organization's members,
// and the operators' plan changes and credit grants.

type planJSON struct {
	Name           string  `json:"name"`
	MonthlyCredits float64 `json:"monthlyCredits"`
	LargestSize    string  `json:"largestSize"`
	MaxConcurrent  int     `json:"maxConcurrent"`
	EgressMiB      int64   `json:"egressMiB"`
	StorageMiB     int64   `json:"storageMiB"`
	Pause          bool    `json:"pause"`
}

func planOut(pl config.Plan) planJSON {
	return planJSON{Name: pl.Name, MonthlyCredits: pl.MonthlyCredits.Credits(), LargestSize: pl.LargestSize,
		MaxConcurrent: pl.MaxConcurrent, EgressMiB: pl.EgressMiB, StorageMiB: pl.StorageMiB, Pause: pl.Pause}
}

// amount is a number of credits both as a float and exactly.
type amount struct {
	Credits float64 `json:"credits"`
	Milli   int64   `json:"milli"`
}

func amountOf(m credits.Milli) amount { return amount{Credits: m.Credits(), Milli: int64(m)} }

type sessionUsageJSON struct {
	SessionID      string  `json:"sessionId"`
	Status         string  `json:"status"`
	Size           string  `json:"size"`
	RunningSeconds float64 `json:"runningSeconds"`
	Credits        amount  `json:"credits"`
	EgressBytes    int64   `json:"egressBytes"`
	SavedBytes     int64   `json:"savedBytes"`
}

type dayUsageJSON struct {
	Date           string  `json:"date"`
	RunningSeconds float64 `json:"runningSeconds"`
	Credits        amount  `json:"credits"`
}

type usageJSON struct {
	Organization gin.H              `json:"organization"`
	Plan         planJSON           `json:"plan"`
	Period       gin.H              `json:"period"`
	Allowance    amount             `json:"allowance"`
	Granted      amount             `json:"granted"`
	Used         amount             `json:"used"`
	Remaining    amount             `json:"remaining"`
	Sessions     []sessionUsageJSON `json:"sessions"`
	Days         []dayUsageJSON     `json:"days"`
}

// getUsage: GET /v1/usage[?period=current|previous|YYYY-MM-DD][&orgId=]:
// the plan, the period's allowance, grants, use and what is left, with
// per-session and per-day totals. A date picks the period holding it.
// orgId other than the caller's is for operators.
func (s *Server) getUsage(c *gin.Context) {
	p := principal(c)
	org := p.Org
	if id := c.Query("orgId"); id != "" && id != p.Org.ID {
		if !p.Operator {
			s.writeError(c, errdefs.NotFound("no such organization"))
			return
		}
		o, _, err := s.db.GetOrg(c.Request.Context(), id)
		if err != nil {
			s.writeError(c, notFoundOrg(err))
			return
		}
		org = o
	}
	now := s.sessions.Now()
	at := now
	switch q := c.Query("period"); q {
	case "", "current":
	case "previous":
		_, anchor, err := s.sessions.OrgPlan(c.Request.Context(), org.ID)
		if err != nil {
			s.writeError(c, err)
			return
		}
		at = credits.PeriodAt(anchor, now).Previous(anchor).Start
	default:
		d, err := time.Parse(time.DateOnly, q)
		if err != nil || d.Year() < 1970 || d.Year() >= 2200 {
			s.writeError(c, badRequest("period: current, previous or a date (YYYY-MM-DD, 1970 to 2199) in the period"))
			return
		}
		at = d
	}
	u, err := s.sessions.Usage(c.Request.Context(), org.ID, at)
	if err != nil {
		s.writeError(c, err)
		return
	}
	sessions, err := s.sessions.List(c.Request.Context(), org.ID, "")
	if err != nil {
		s.writeError(c, err)
		return
	}
	byPK := map[string]*store.Session{}
	for i := range sessions {
		byPK[sessions[i].ID] = &sessions[i]
	}
	out := usageJSON{
		Organization: gin.H{"id": org.ID, "name": org.Name},
		Plan:         planOut(u.Plan),
		Period:       gin.H{"start": u.Period.Start, "end": u.Period.End},
		Allowance:    amountOf(u.Allowance), Granted: amountOf(u.Granted),
		Used: amountOf(u.Used()), Remaining: amountOf(u.Remaining()),
		Sessions: []sessionUsageJSON{}, Days: []dayUsageJSON{},
	}
	for _, su := range u.Summary.Sessions {
		j := sessionUsageJSON{SessionID: su.SessionID, Size: su.Size, RunningSeconds: su.Running.Seconds(), Credits: amountOf(su.Credits)}
		ses := byPK[su.SessionPK]
		if ses == nil { // deleted since: its row stays, hidden from the lists
			if row, err := s.db.GetSessionByID(c.Request.Context(), su.SessionPK); err == nil && row.OrgID == org.ID {
				ses = &row
			}
		}
		if ses != nil {
			j.Status, j.EgressBytes, j.SavedBytes = ses.Status, ses.EgressBytesUsed, ses.Saved.Bytes
			if ses.Status == store.StatusDeleted {
				j.SavedBytes = 0 // its saves went with it
			}
		}
		out.Sessions = append(out.Sessions, j)
	}
	for _, d := range u.Summary.Days {
		out.Days = append(out.Days, dayUsageJSON{Date: d.Day.Format(time.DateOnly), RunningSeconds: d.Running.Seconds(), Credits: amountOf(d.Credits)})
	}
	c.JSON(http.StatusOK, out)
}

func notFoundOrg(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return errdefs.NotFound("no such organization")
	}
	return err
}

// operatorOrg reads the :orgId an operator acts on.
func (s *Server) operatorOrg(c *gin.Context) (store.Org, bool) {
	o, _, err := s.db.GetOrg(c.Request.Context(), c.Param("orgId"))
	if err != nil {
		s.writeError(c, notFoundOrg(err))
		return o, false
	}
	return o, true
}

// auditTarget also records an operator's change in the organization it
// changed, so that organization's audit log shows it.
func (s *Server) auditTarget(c *gin.Context, org store.Org, action string, status int, details map[string]any) {
	p := principal(c)
	if org.ID == p.Org.ID {
		return
	}
	s.db.Audit(store.AuditRecord{Time: s.sessions.Now(), OrgID: org.ID, UserID: p.User.ID, TokenID: p.TokenID, Action: action,
		Outcome: "ok", Status: status, RemoteAddr: c.ClientIP(), RequestID: requestID(c), Details: details})
}

// setPlan: PUT /v1/orgs/:orgId/plan {"plan": "pro"} (operators).
func (s *Server) setPlan(c *gin.Context) {
	org, ok := s.operatorOrg(c)
	if !ok {
		return
	}
	var req struct {
		Plan string `json:"plan"`
	}
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	pl, ok := s.cfg.Plans.Get(req.Plan)
	if req.Plan == "" || !ok {
		s.writeError(c, badRequest("plan: one of %v", s.cfg.Plans.Names()))
		return
	}
	if err := s.db.SetPlan(c.Request.Context(), org.ID, pl.Name); err != nil {
		s.writeError(c, notFoundOrg(err))
		return
	}
	d := map[string]any{"orgId": org.ID, "plan": pl.Name}
	auditDetail(c, "orgId", org.ID)
	auditDetail(c, "plan", pl.Name)
	s.auditTarget(c, org, "org.plan_set", http.StatusOK, d)
	c.JSON(http.StatusOK, gin.H{"organization": gin.H{"id": org.ID, "name": org.Name}, "plan": planOut(pl)})
}

// grantCredits: POST /v1/orgs/:orgId/credits {"credits": 100, "note": "..."}
// adds credits to the organization's current period (operators).
func (s *Server) grantCredits(c *gin.Context) {
	org, ok := s.operatorOrg(c)
	if !ok {
		return
	}
	var req struct {
		Credits json.Number `json:"credits"`
		Note    string      `json:"note"`
	}
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	amt, err := credits.ParseGrant(req.Credits.String())
	if err != nil {
		s.writeError(c, badRequest("%v", err))
		return
	}
	if len(req.Note) > 500 {
		s.writeError(c, badRequest("note: at most 500 bytes"))
		return
	}
	p := principal(c)
	g, err := s.db.AddCreditGrant(c.Request.Context(), store.CreditGrant{OrgID: org.ID, AmountMilli: int64(amt), Time: s.sessions.Now(), GrantedBy: p.User.ID, Note: req.Note})
	if err != nil {
		s.writeError(c, notFoundOrg(err))
		return
	}
	d := map[string]any{"orgId": org.ID, "creditsMilli": int64(amt), "note": req.Note}
	for k, v := range d {
		auditDetail(c, k, v)
	}
	s.auditTarget(c, org, "org.credits_grant", http.StatusCreated, d)
	u, err := s.sessions.Usage(c.Request.Context(), org.ID, time.Time{})
	if err != nil {
		s.writeError(c, err)
		return
	}
	c.JSON(http.StatusCreated, gin.H{"grant": gin.H{"id": g.ID, "credits": amountOf(amt), "time": g.Time, "note": g.Note},
		"remaining": amountOf(u.Remaining()), "period": gin.H{"start": u.Period.Start, "end": u.Period.End}})
}
