-- Next edits in the file that imports what was renamed, end to end: the real `quickdraft serve`
-- with its default next-edit settings. In shapes.py the function `area` is renamed to `surface`
-- in Normal mode, and <Tab><Tab> applies the rename of its use there. Then report.py, which
-- imports `area` from shapes, is opened: the rename of its import is drawn without a keystroke,
-- <Tab><Tab> applies it, and the rename of its call comes next; :wall writes both files.
--
-- Driven by tests/e2e/test_nvim_nextedit.py: QD_PLUGIN, QD_CMD (JSON list), QD_FILE (shapes.py),
-- QD_REPORT (report.py), QD_RESULT.

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

vim.cmd('filetype on')

local api = vim.api
local nextedit = H.setup_next_edits()

H.run(function()
  vim.cmd.edit(os.getenv('QD_FILE'))
  if not H.check('the server starts and attaches to shapes.py', H.attached_client(30000) ~= nil) then
    return
  end
  -- Rename `area` to `surface` on its def line: `cw` on it, then <Esc>.
  api.nvim_win_set_cursor(0, { 1, 4 })
  H.type('cwsurface<Esc>')
  local use = H.tab_tab(nextedit, 'shapes.py, its use', nil)
  if use == nil then
    return
  end
  -- Now the file that imports it: nothing typed there yet.
  vim.cmd.edit(os.getenv('QD_REPORT'))
  local import = H.tab_tab(nextedit, 'report.py, its import', use)
  if import == nil then
    return
  end
  H.tab_tab(nextedit, 'report.py, its call', import)
  vim.cmd('silent wall')
  H.data.shapes_on_disk = H.text_on_disk(os.getenv('QD_FILE'))
  H.data.report_on_disk = H.text_on_disk(os.getenv('QD_REPORT'))
end)
