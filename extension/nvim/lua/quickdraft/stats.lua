-- `$/quickdraft/stats` notifications: running totals and the text shown by :QuickdraftStatus.
-- Pure functions, unit-tested by tests/config_spec.lua.

local M = {}

local function number(value)
  if type(value) == 'number' and value == value and value ~= math.huge and value ~= -math.huge then
    return value
  end
  return nil
end

local function sum_counts(counts)
  if type(counts) ~= 'table' then
    return nil
  end
  local total = 0
  for _, value in pairs(counts) do
    local n = number(value)
    if n and n > 0 then
      total = total + n
    end
  end
  return total
end

--- The notification's params with snake_case keys (`latencyMs` -> `latency_ms`, ...); a
--- snake_case key wins over its camelCase twin.
---@param raw any
---@return table
function M.normalize(raw)
  local out = {}
  if type(raw) ~= 'table' then
    return out
  end
  for key, value in pairs(raw) do
    if type(key) == 'string' then
      local snake = (key:sub(1, 1) .. key:sub(2):gsub('(%u)', '_%1')):lower()
      if out[snake] == nil or snake == key then
        out[snake] = value
      end
    end
  end
  return out
end

--- accepted / drafted for one completion (nil when the server did not say how many it drafted).
---@param stats table
---@return number|nil rate, number|nil accepted, number|nil drafted
function M.acceptance(stats)
  local accepted = sum_counts(stats.accepted_by_source)
  local drafted = sum_counts(stats.drafted_by_source)
  if accepted and drafted and drafted > 0 then
    return math.min(1, accepted / drafted), accepted, drafted
  end
  return nil, accepted, drafted
end

local function ms(value)
  if value >= 10000 then
    return ('%.1f s'):format(value / 1000)
  end
  return ('%d ms'):format(math.floor(value + 0.5))
end

--- Whether the server reported fewer than one token per forward for a computed answer.
---@param stats table
---@return boolean
function M.too_few_tokens_per_forward(stats)
  local tpf = number(stats.tokens_per_forward)
  local tokens = number(stats.tokens)
  return stats.cached ~= true and tpf ~= nil and tpf < 1 and (tokens == nil or tokens > 0)
end

--- What made one completion fast, for a person: `{ kind = 'cached' }` (answered with no model
--- work), `{ kind = 'copied' | 'drafted', accepted = N, tokens = M }` (N of its M new tokens came
--- from drafts the model accepted: `copied` when all of them from the n-gram drafter, i.e. text
--- copied from the open files, `drafted` when the draft model proposed some), or nil: no draft
--- was tried (`drafted_by_source` empty or all zeros), or none was accepted.
---@param stats table
---@return table|nil
function M.speedup(stats)
  if stats.cached == true then
    return { kind = 'cached' }
  end
  local drafted = sum_counts(stats.drafted_by_source)
  local accepted = sum_counts(stats.accepted_by_source)
  local tokens = number(stats.tokens)
  if not drafted or drafted <= 0 or not accepted or accepted <= 0 or not tokens or tokens <= 0 then
    return nil
  end
  local others = accepted - (number((stats.accepted_by_source or {}).ngram) or 0)
  return {
    kind = others > 0 and 'drafted' or 'copied',
    accepted = math.min(accepted, tokens),
    tokens = tokens,
  }
end

--- A short line: the latency, then what sped it up: `84 ms · copied 12 of 15 tokens`,
--- `2 ms · cached`, or only `310 ms` when no draft was tried.
---@param stats table|nil
---@return string
function M.format(stats)
  if type(stats) ~= 'table' then
    return 'no completion yet'
  end
  local latency = number(stats.latency_ms)
  local parts = { latency and ms(latency) or nil }
  local speedup = M.speedup(stats)
  if speedup and speedup.kind == 'cached' then
    table.insert(parts, 'cached')
  elseif speedup then
    table.insert(parts, ('%s %d of %d tokens'):format(speedup.kind, speedup.accepted, speedup.tokens))
  end
  return #parts > 0 and table.concat(parts, ' · ') or '-'
end

local SOURCE_NAMES = { ngram = 'copied from open files', draft = 'draft model' }

--- One line of detail for :QuickdraftStatus: tokens, forwards and the drafts by source.
---@param stats table|nil
---@return string|nil
function M.details(stats)
  if type(stats) ~= 'table' then
    return nil
  end
  if stats.cached == true then
    local source = type(stats.source) == 'string' and stats.source ~= '' and (' (' .. stats.source .. ')') or ''
    return 'answered from work done before' .. source .. ', no model work'
  end
  local parts = { ('%d tokens'):format(number(stats.tokens) or 0) }
  local forwards = number(stats.target_forwards)
  if forwards and forwards > 0 then
    table.insert(parts, ('%d forwards of the model'):format(forwards))
  end
  local drafted = type(stats.drafted_by_source) == 'table' and stats.drafted_by_source or {}
  local accepted = type(stats.accepted_by_source) == 'table' and stats.accepted_by_source or {}
  local sources = {}
  for _, source in ipairs(vim.tbl_keys(drafted)) do
    local n = number(drafted[source])
    if n and n > 0 then
      table.insert(sources, ('%s %d of %d accepted'):format(SOURCE_NAMES[source] or source,
        number(accepted[source]) or 0, n))
    end
  end
  table.sort(sources)
  table.insert(parts, #sources > 0 and ('drafts: ' .. table.concat(sources, ', ')) or 'no drafts tried')
  return table.concat(parts, ', ')
end

--- Whether a stats notification is about a next edit (`feature: "inlineEdit"`), not a
--- completion: those are kept apart (the statusline and the totals are about completions).
---@param raw any
---@return boolean
function M.is_next_edit(raw)
  return type(raw) == 'table' and raw.feature == 'inlineEdit'
end

--- One line for the last next edit: `140 ms · 3.20 tokens per forward · 1 edit (40 of 52
--- tokens copied)` for the model's rewrite, `rename 0.90 · 38 ms · 1 edit · vetoed: undo 1`
--- for a rule's edit, with why the model's answer was refused, or why no edit was proposed.
---@param stats table|nil normalized
---@return string
function M.format_edit(stats)
  if type(stats) ~= 'table' then
    return 'no next edit yet'
  end
  local parts = {}
  if type(stats.rule) == 'string' and stats.rule ~= '' then
    local confidence = number(stats.confidence)
    table.insert(parts, confidence and ('%s %.2f'):format(stats.rule, confidence) or stats.rule)
  end
  local latency = number(stats.latency_ms)
  if latency then
    table.insert(parts, ms(latency))
  end
  local tpf = number(stats.tokens_per_forward)
  if tpf and tpf > 0 then
    table.insert(parts, ('%.2f tokens per forward'):format(tpf))
  end
  local count = number(stats.edit_count) or 0
  local edits = ('%d edit%s'):format(count, count == 1 and '' or 's')
  local tokens, copied = number(stats.tokens), number(stats.copied_tokens)
  if tokens and tokens > 0 and copied then
    edits = edits .. (' (%d of %d tokens copied)'):format(copied, tokens)
  end
  table.insert(parts, edits)
  if type(stats.vetoed) == 'table' then
    local vetoes = {}
    for name, n in pairs(stats.vetoed) do
      if type(n) == 'number' and n > 0 then
        table.insert(vetoes, ('%s %d'):format(name, n))
      end
    end
    table.sort(vetoes)
    if #vetoes > 0 then
      table.insert(parts, 'vetoed: ' .. table.concat(vetoes, ', '))
    end
  end
  if type(stats.rejected) == 'string' and stats.rejected ~= '' then
    table.insert(parts, 'refused: ' .. stats.rejected)
  end
  if type(stats.abstained) == 'string' and stats.abstained ~= '' then
    table.insert(parts, 'no edit: ' .. stats.abstained)
  end
  return table.concat(parts, ' · ')
end

--- Running totals over a session.
---@return table
function M.new_totals()
  -- completions counts every answer, `cached` those without model work; tokens, latency and
  -- acceptance are over the computed ones.
  -- accepted: new tokens that came from accepted drafts.
  return { completions = 0, cached = 0, tokens = 0, latency_ms = 0, accepted = 0, drafted = 0, last = nil }
end

---@param totals table
---@param stats table
function M.add(totals, stats)
  if type(stats) ~= 'table' then
    return
  end
  stats = M.normalize(stats)
  totals.last = stats
  totals.completions = totals.completions + 1
  if stats.cached == true then
    totals.cached = totals.cached + 1
    return
  end
  totals.tokens = totals.tokens + (number(stats.tokens) or 0)
  totals.latency_ms = totals.latency_ms + (number(stats.latency_ms) or 0)
  local _, _, drafted = M.acceptance(stats)
  local speedup = M.speedup(stats)
  totals.accepted = totals.accepted + (speedup and speedup.accepted or 0)
  totals.drafted = totals.drafted + (drafted or 0)
end

--- One line of session totals.
---@param totals table
---@return string
function M.format_totals(totals)
  if totals.completions == 0 then
    return 'no completion yet'
  end
  local computed = totals.completions - totals.cached
  local line = ('%d completions'):format(totals.completions)
  if totals.cached > 0 then
    line = line .. (' (%d cached)'):format(totals.cached)
  end
  line = line .. (', %d tokens'):format(totals.tokens)
  if totals.accepted > 0 then
    line = line .. (' (%d from drafts)'):format(totals.accepted)
  end
  if computed > 0 then
    line = line .. (', mean %s'):format(ms(totals.latency_ms / computed))
  end
  return line
end

return M
