ALTER TABLE tasks RESET (fillfactor);
